"""Grouping clients by their head descriptors: seeded k-means (docs/hdcfl.md, section 2).

Labels are canonical: group 0 is the group of client 0, group 1 the group of the
first client not in group 0, and so on. k-means numbers its clusters arbitrarily,
and canonical labels keep logs and tests stable.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Grouping:
    """Hard labels c_k and centroids mu_g; G_eff = centroids.shape[0]."""

    labels: np.ndarray  # (K,) int64, values 0..G_eff-1, canonical order
    centroids: np.ndarray  # (G_eff, r) float64


def group_clients(descriptors: np.ndarray, groups: int, seed: int, n_init: int = 10) -> Grouping:
    """k-means (k-means++, `n_init` restarts, random_state=`seed`) into G_eff groups.

    G_eff = min(groups, number of distinct descriptors) <= min(groups, K): with
    fewer distinct points than groups, k-means would return duplicate centroids
    for empty clusters, and an empty group has no encoder to make a prototype of.
    """
    points = np.asarray(descriptors, dtype=np.float64)
    if points.ndim != 2 or points.shape[0] == 0:
        raise ValueError(f"descriptors must be a non-empty (clients, dims) array, got shape {points.shape}")
    if not np.all(np.isfinite(points)):
        raise ValueError("descriptors contain NaN or infinite entries")
    _check_positive_int(groups, "groups")
    _check_positive_int(n_init, "n_init")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**32:
        raise ValueError(f"seed must be an integer in [0, 2**32), got {seed!r}")

    distinct_points = np.unique(points, axis=0).shape[0] if points.shape[1] > 0 else 1
    effective_groups = min(int(groups), distinct_points)
    if effective_groups == 1:
        labels = np.zeros(points.shape[0], dtype=np.int64)
        return Grouping(labels=labels, centroids=points.mean(axis=0, keepdims=True))

    from sklearn.cluster import KMeans  # imported on use: sklearn adds a second to every actor's start

    kmeans = KMeans(n_clusters=effective_groups, init="k-means++", n_init=int(n_init), random_state=int(seed))
    raw_labels = kmeans.fit_predict(points)
    return _canonical(raw_labels, np.asarray(kmeans.cluster_centers_, dtype=np.float64))


def _canonical(raw_labels: np.ndarray, raw_centroids: np.ndarray) -> Grouping:
    """Renumber groups by their smallest client index; drop clusters nobody joined."""
    _, first_index = np.unique(raw_labels, return_index=True)
    order = raw_labels[np.sort(first_index)]  # old labels by first appearance
    new_label_of = np.full(raw_centroids.shape[0], -1, dtype=np.int64)
    new_label_of[order] = np.arange(order.shape[0], dtype=np.int64)
    return Grouping(labels=new_label_of[raw_labels], centroids=raw_centroids[order].copy())


def _check_positive_int(value: int, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
