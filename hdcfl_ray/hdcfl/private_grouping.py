"""HDC-FL's grouping under a `privacy` section (docs/privacy.md): the heads stay on the
clients, and the server groups what they release instead.

A client's head sketch is its unit head projected on `rank` public directions (drawn from
the run seed, the same for every client; the server reads no head to fit them, unlike the
low-rank descriptor's PCA) and scaled to unit norm: a vector of norm 1, so a client's
sketch plus N(0, z^2) noise on every coordinate is a Gaussian mechanism of multiplier z
per client, one release of the round the accountant counts. The server keeps each
client's last noised sketch (a released value), and at a refresh groups them with the
same seeded k-means and memberships as without privacy.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from hdcfl_ray import seeding
from hdcfl_ray.diagnostics.clustering import silhouette
from hdcfl_ray.hdcfl.descriptors import unit_normalise
from hdcfl_ray.hdcfl.grouping import group_clients
from hdcfl_ray.hdcfl.membership import hard_memberships, soft_memberships


@lru_cache(maxsize=4)
def sketch_axes(seed: int, head_length: int, rank: int) -> np.ndarray:
    """(head_length, r) orthonormal columns, r = min(rank, head_length), from the run's
    seed alone: public, so they cost no privacy."""
    width = min(int(rank), int(head_length))
    gaussian = seeding.rng(seed, "privacy_head_sketch", head_length, width).standard_normal((head_length, width))
    axes, _ = np.linalg.qr(gaussian)
    axes.setflags(write=False)
    return axes


def head_sketch(head: np.ndarray, axes: np.ndarray) -> np.ndarray:
    """unit(axes^T unit(head)), float64: norm 1 (0 for a zero head or one orthogonal to every axis)."""
    unit_head = unit_normalise(np.asarray(head, dtype=np.float64)[None, :])[0]
    return unit_normalise((unit_head @ axes)[None, :])[0]


@dataclass(frozen=True)
class PrivateGrouping:
    """The groups of the clients whose noised sketches the server holds, in the order given."""

    labels: np.ndarray  # (K,) int64, canonical
    memberships: np.ndarray  # (K, G) rows summing to 1
    num_groups: int
    silhouette: float


def group_sketches(sketches: np.ndarray, groups: int, membership: str, temperature: float, temperature_scale: str, seed: int, n_init: int) -> PrivateGrouping:
    """k-means of the noised sketches (rows) and each client's memberships: post-processing
    of released values, so it costs nothing more."""
    points = np.asarray(sketches, dtype=np.float64)
    grouping = group_clients(points, groups, seed=seed, n_init=n_init)
    num_groups = int(grouping.centroids.shape[0])
    if membership == "soft":
        memberships = soft_memberships(points, grouping.centroids, grouping.labels, temperature, temperature_scale)
    else:
        memberships = hard_memberships(grouping.labels, num_groups)
    return PrivateGrouping(labels=grouping.labels, memberships=memberships, num_groups=num_groups, silhouette=silhouette(points, grouping.labels))
