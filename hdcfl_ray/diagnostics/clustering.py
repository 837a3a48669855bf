"""Diagnostics of a grouping (docs/hdcfl.md, "Diagnostics"): silhouette on the
descriptors, ARI against another labelling or the previous refresh, membership
entropy, and the personalisation gain of the mixture over the global encoder.

Undefined values are NaN rather than errors: a refresh with one group still logs.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np


def silhouette(descriptors: np.ndarray, labels: np.ndarray) -> float:
    """Mean silhouette (Euclidean) of `labels` on `descriptors`; NaN when it is
    undefined, i.e. fewer than 2 groups or as many groups as clients."""
    points = np.asarray(descriptors, dtype=np.float64)
    label_array = np.asarray(labels)
    if points.ndim != 2 or label_array.shape != (points.shape[0],):
        raise ValueError(f"descriptors {points.shape} and labels {label_array.shape} must be (K, r) and (K,)")
    num_groups = np.unique(label_array).shape[0]
    if num_groups < 2 or num_groups >= points.shape[0] or points.shape[1] == 0:
        return float("nan")
    from sklearn.metrics import silhouette_score  # imported on use (slow to import)

    return float(silhouette_score(points, label_array, metric="euclidean"))


def adjusted_rand(labels_a: np.ndarray, labels_b: np.ndarray) -> float:
    """Adjusted Rand index of two labellings of the same clients (1 = same partition)."""
    first, second = np.asarray(labels_a), np.asarray(labels_b)
    if first.ndim != 1 or first.shape != second.shape:
        raise ValueError(f"labellings must be 1-D and equally long, got {first.shape} and {second.shape}")
    if first.shape[0] == 0:
        return float("nan")
    from sklearn.metrics import adjusted_rand_score

    return float(adjusted_rand_score(first, second))


def ari_between_refreshes(prev_labels: Mapping[int, int], labels: Mapping[int, int]) -> float:
    """ARI of two refreshes' hard labels over the clients present in both
    (client id -> group); NaN with fewer than 2 clients in common."""
    common = sorted(set(prev_labels) & set(labels))
    if len(common) < 2:
        return float("nan")
    return adjusted_rand(np.asarray([prev_labels[c] for c in common]), np.asarray([labels[c] for c in common]))


def membership_entropy(memberships: np.ndarray) -> tuple[float, float]:
    """(mean over clients of -sum_g pi_kg log pi_kg in nats, the same divided by log G).

    With G == 1 every membership is certain: both values are 0."""
    weights = np.asarray(memberships, dtype=np.float64)
    if weights.ndim != 2 or weights.shape[0] == 0 or weights.shape[1] == 0:
        raise ValueError(f"memberships must be a non-empty (clients, groups) array, got shape {weights.shape}")
    if np.any(weights < 0) or not np.allclose(weights.sum(axis=1), 1.0, atol=1e-6):
        raise ValueError("membership rows must be non-negative and sum to 1")
    # 0 log 0 = 0: a group a client has no share in adds no uncertainty.
    safe = np.where(weights > 0, weights, 1.0)
    mean_entropy = float(np.mean(-np.sum(weights * np.log(safe), axis=1)))
    groups = weights.shape[1]
    normalised = mean_entropy / float(np.log(groups)) if groups > 1 else 0.0
    return mean_entropy, normalised


def personalisation_gain(acc_personalised: np.ndarray, acc_global: np.ndarray) -> tuple[float, float]:
    """(mean of acc(phi_k, h_k) - acc(global, h_k) in percentage points, fraction of
    clients whose gain is > 0). Accuracies are fractions in [0, 1]; a client with
    NaN in either array is left out; NaN for both values if none is left."""
    personalised = np.asarray(acc_personalised, dtype=np.float64)
    reference = np.asarray(acc_global, dtype=np.float64)
    if personalised.ndim != 1 or personalised.shape != reference.shape:
        raise ValueError(f"accuracy arrays must be 1-D and equally long, got {personalised.shape} and {reference.shape}")
    scored = np.isfinite(personalised) & np.isfinite(reference)
    for name, values in (("acc_personalised", personalised), ("acc_global", reference)):
        if np.any((values[scored] < 0) | (values[scored] > 1)):
            raise ValueError(f"{name} must be fractions in [0, 1], got {values[scored].tolist()}")
    if not np.any(scored):
        return float("nan"), float("nan")
    gains = personalised[scored] - reference[scored]
    return float(100.0 * np.mean(gains)), float(np.mean(gains > 0))
