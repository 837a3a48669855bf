"""Client-to-group memberships pi_kg (docs/hdcfl.md, section 4).

Soft memberships are a softmax over negative squared distances to the centroids,
at a temperature tau * S set by the grouping's own geometry, so tau = 1 means the
same softness whatever the scale of the descriptors. Two scales S:

- `within` (the spec's): the mean squared distance of a client to its own
  centroid. When groups are tight and far apart (the usual case at CPU scale)
  every client is many within-spreads from any other centroid, and the rows are
  one-hot in all but name (normalised entropy 0.0007 on the quickstart).
- `between`: the mean squared distance between two centroids. A client on its
  own centroid then gives a centroid at the typical distance weight e^(-1/tau)
  of its own, so soft and hard memberships differ whatever the groups' spread.

Hard memberships are one-hot.
"""

from __future__ import annotations

import numpy as np

TEMPERATURE_FLOOR = 1e-8


def soft_memberships(
    descriptors: np.ndarray, centroids: np.ndarray, labels: np.ndarray, temperature: float, scale: str = "within"
) -> np.ndarray:
    """pi_kg = softmax_g(-||z_k - mu_g||^2 / T), T = tau * S, with S (`scale`)
    mean_k ||z_k - mu_{c_k}||^2 (`within`) or mean_{g<h} ||mu_g - mu_h||^2
    (`between`; with one group, `within`).

    T is floored at 1e-8 so a perfect grouping (every client on its centroid)
    gives near-one-hot rows instead of a division by zero. Returns (K, G) float64
    with rows summing to 1.
    """
    points = np.asarray(descriptors, dtype=np.float64)
    centres = np.asarray(centroids, dtype=np.float64)
    if points.ndim != 2 or centres.ndim != 2 or points.shape[1] != centres.shape[1]:
        raise ValueError(f"descriptors {points.shape} and centroids {centres.shape} must be (K, r) and (G, r)")
    if centres.shape[0] == 0:
        raise ValueError("centroids must hold at least one group")
    label_array = _check_labels(labels, points.shape[0], centres.shape[0])
    if not np.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"temperature must be a positive number, got {temperature!r}")

    if scale not in ("within", "between"):
        raise ValueError(f"hdcfl.temperature_scale: {scale!r} is not one of within, between")

    squared_distances = _squared_distances(points, centres)
    if scale == "between" and centres.shape[0] >= 2:
        pairs = np.triu_indices(centres.shape[0], k=1)
        between = np.sum((centres[:, None, :] - centres[None, :, :]) ** 2, axis=2)[pairs]
        spread = float(np.mean(between))
    else:
        spread = float(np.mean(squared_distances[np.arange(points.shape[0]), label_array]))
    temperature_value = max(float(temperature) * spread, TEMPERATURE_FLOOR)
    return _softmax_of_distances(squared_distances, temperature_value)


def memberships_at(descriptors: np.ndarray, centroids: np.ndarray, temperature_value: float) -> np.ndarray:
    """pi_kg = softmax_g(-||z_k - mu_g||^2 / T) at a given T (`soft_memberships`'s T, after its
    floor): the soft rows of descriptors that took no part in setting T, a newcomer's,
    against a refresh's centres. (K, G) float64, rows summing to 1."""
    points = np.atleast_2d(np.asarray(descriptors, dtype=np.float64))
    centres = np.asarray(centroids, dtype=np.float64)
    if centres.ndim != 2 or points.shape[1] != centres.shape[1] or centres.shape[0] == 0:
        raise ValueError(f"descriptors {points.shape} and centroids {centres.shape} must be (K, r) and (G >= 1, r)")
    return _softmax_of_distances(_squared_distances(points, centres), float(temperature_value))


def membership_temperature(
    descriptors: np.ndarray, centroids: np.ndarray, labels: np.ndarray, temperature: float, scale: str = "within"
) -> float:
    """The T = max(tau * S, floor) that `soft_memberships` uses for these arguments."""
    points = np.asarray(descriptors, dtype=np.float64)
    centres = np.asarray(centroids, dtype=np.float64)
    label_array = _check_labels(labels, points.shape[0], centres.shape[0])
    squared_distances = _squared_distances(points, centres)
    if scale == "between" and centres.shape[0] >= 2:
        pairs = np.triu_indices(centres.shape[0], k=1)
        spread = float(np.mean(np.sum((centres[:, None, :] - centres[None, :, :]) ** 2, axis=2)[pairs]))
    else:
        spread = float(np.mean(squared_distances[np.arange(points.shape[0]), label_array]))
    return max(float(temperature) * spread, TEMPERATURE_FLOOR)


def _squared_distances(points: np.ndarray, centres: np.ndarray) -> np.ndarray:
    return np.sum((points[:, None, :] - centres[None, :, :]) ** 2, axis=2)


def _softmax_of_distances(squared_distances: np.ndarray, temperature_value: float) -> np.ndarray:
    logits = -squared_distances / temperature_value
    # Shifting by the row maximum keeps exp() in range; the softmax is unchanged.
    logits -= logits.max(axis=1, keepdims=True)
    weights = np.exp(logits)
    return weights / weights.sum(axis=1, keepdims=True)


def hard_memberships(labels: np.ndarray, groups: int) -> np.ndarray:
    """One-hot rows: pi_kg = 1 if c_k == g else 0, as (K, groups) float64."""
    if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)) or groups < 1:
        raise ValueError(f"groups must be a positive integer, got {groups!r}")
    label_array = _check_labels(labels, None, int(groups))
    memberships = np.zeros((label_array.shape[0], int(groups)), dtype=np.float64)
    memberships[np.arange(label_array.shape[0]), label_array] = 1.0
    return memberships


def _check_labels(labels: np.ndarray, num_clients: int | None, groups: int) -> np.ndarray:
    label_array = np.asarray(labels)
    if label_array.ndim != 1 or not np.issubdtype(label_array.dtype, np.integer):
        raise ValueError(f"labels must be a 1-D integer array, got {label_array.dtype} of shape {label_array.shape}")
    if num_clients is not None and label_array.shape[0] != num_clients:
        raise ValueError(f"got {label_array.shape[0]} labels for {num_clients} clients")
    if label_array.size and (label_array.min() < 0 or label_array.max() >= groups):
        raise ValueError(f"labels must lie in 0..{groups - 1}, got values {sorted(set(label_array.tolist()))}")
    return label_array.astype(np.int64)
