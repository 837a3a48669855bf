"""HDC-FL's grouping under a `privacy` section (docs/privacy.md): the heads stay on the
clients, and the groups come from noised sums, never from any client's descriptor.

A client's head sketch is its unit head projected on `sketch_width` public orthonormal
directions (drawn from the run seed, the same for every client: the server reads no head to
fit them, unlike the low-rank descriptor's PCA); its norm is at most 1. Every head shares
a large common part (each has learnt the same classes), so, as the low-rank descriptor
centres the heads before its PCA, the sketches are centred: at each refresh the server first
releases the mean sketch (the sampled clients' noised sum of [sketch, 1] over its noised
count, one release) and each client's point is its sketch minus that mean, scaled to unit
norm. Measured on the saved heads of a CIFAR-10 rotation run (docs/privacy-study.md),
uncentred sketches of 8 coordinates leave k-means on them at an ARI of 0.2-0.5 where the
heads themselves give 1.0; centred sketches of 64 coordinates give 1.0.

The groups are k-means run as private Lloyd steps (the sums-and-counts form of DP k-means)
on those points: at each step every sampled client takes the centre nearest its own point,
and the server releases each group's sum of [point, 1] with Gaussian noise; a client adds a
vector of norm at most sqrt(2) to one group, so a step is one Gaussian mechanism of
multiplier z whose noise is z sqrt(2) on every coordinate (times the noise cohort's factor,
as for the model's sums); the mean's release is the same mechanism. The new centres are the
noised sums over the noised counts; a group whose noised count is below the minimum group
size starts again from a fresh public direction (k-means' restart of a lost centre). The
centres persist from refresh to refresh, so the steps of all refreshes refine one k-means;
the first starts from public seeded directions.

A client's memberships are its softmax over the squared distances from its own point to
the released centres, at a temperature measured between the centres (`between`): they
depend on the client's own data and on released values only.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping

import numpy as np

from hdcfl_ray import seeding
from hdcfl_ray.diagnostics.clustering import silhouette
from hdcfl_ray.hdcfl.descriptors import unit_normalise
from hdcfl_ray.hdcfl.membership import hard_memberships, memberships_at
from hdcfl_ray.privacy.gaussian_sum import noised_sum

# Lloyd steps a refresh round runs: each one release the accountant counts
LLOYD_STEPS_PER_REFRESH = 3
# a refresh's releases on the sketches: the mean sketch, then the Lloyd steps
SKETCH_RELEASES_PER_REFRESH = 1 + LLOYD_STEPS_PER_REFRESH


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
    """axes^T unit(head), float64: norm at most 1 (the axes are orthonormal; 0 for a zero head)."""
    unit_head = unit_normalise(np.asarray(head, dtype=np.float64)[None, :])[0]
    return unit_head @ axes


def released_sketch_mean(sketches: np.ndarray, noise_multiplier: float, noise_factor: float, rng: np.random.Generator) -> np.ndarray:
    """The sampled clients' mean sketch as one Gaussian release: the noised sum of [sketch, 1]
    (each of norm at most sqrt(2)) over its noised count, std `noise_multiplier` * sqrt(2) *
    `noise_factor` on every coordinate; zeros when the noised count is below 1."""
    width = int(sketches.shape[1])
    std = float(noise_multiplier) * np.sqrt(2.0) * float(noise_factor)
    total = noised_sum([np.concatenate([row, [1.0]]) for row in sketches], std, rng, size=width + 1).astype(np.float64)
    return total[:-1] / total[-1] if total[-1] >= 1.0 else np.zeros(width)


def centred_points(sketches: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """unit(sketch - mean) per row: what a client groups itself by, given the released mean."""
    return unit_normalise(np.asarray(sketches, dtype=np.float64) - np.asarray(mean, dtype=np.float64)[None, :])


def initial_centres(seed: int, groups: int, width: int) -> np.ndarray:
    """The first refresh's starting centres: `groups` seeded unit directions (public)."""
    return unit_normalise(seeding.rng(seed, "privacy_head_sketch", groups, width, 1).standard_normal((groups, width)))


def nearest_centre(sketches: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """Each row's nearest centre (ties to the lower index), as each client computes its own."""
    distances = np.sum((sketches[:, None, :] - centres[None, :, :]) ** 2, axis=2)
    return np.argmin(distances, axis=1).astype(np.int64)


@dataclass(frozen=True)
class LloydRelease:
    """The centres after the released steps, and the noised counts of the last step."""

    centres: np.ndarray  # (G, r)
    counts: np.ndarray  # (G,)


def private_lloyd(
    sketches: np.ndarray,
    centres: np.ndarray,
    steps: int,
    noise_multiplier: float,
    noise_factor: float,
    min_group_size: int,
    rngs: list[np.random.Generator],
) -> LloydRelease:
    """`steps` private Lloyd steps from `centres` on the sampled clients' points `sketches` (rows of
    norm at most 1): each step one Gaussian release of the groups' [sum of sketches, count]
    with std `noise_multiplier` * sqrt(2) * `noise_factor`, drawn from its own generator."""
    current = np.asarray(centres, dtype=np.float64).copy()
    groups, width = current.shape
    std = float(noise_multiplier) * np.sqrt(2.0) * float(noise_factor)
    counts = np.zeros(groups)
    for step in range(steps):
        labels = nearest_centre(sketches, current) if len(sketches) else np.zeros(0, dtype=np.int64)
        for group in range(groups):
            members = [np.concatenate([sketches[i], [1.0]]) for i in np.flatnonzero(labels == group)]
            total = noised_sum(members, std, rngs[step], size=width + 1).astype(np.float64)
            counts[group] = total[-1]
            if total[-1] >= max(1, min_group_size):
                current[group] = total[:-1] / total[-1]
            else:  # an empty group starts again from a fresh public direction, as k-means restarts a lost centre
                current[group] = unit_normalise(rngs[step].standard_normal((1, width)))[0]
    return LloydRelease(centres=current, counts=counts)


@dataclass(frozen=True)
class PrivateGrouping:
    """The groups of the clients whose sketches the server holds, in the order given."""

    labels: np.ndarray  # (K,) int64: the nearest released centre
    memberships: np.ndarray  # (K, G) rows summing to 1
    num_groups: int
    silhouette: float


def memberships_from_centres(
    sketches: Mapping[int, np.ndarray], mean: np.ndarray, centres: np.ndarray, membership: str, temperature: float
) -> PrivateGrouping:
    """Each client's group and memberships from its own sketch, the released mean sketch and
    the released centres; soft rows at T = temperature x the mean squared distance between
    the centres."""
    client_ids = sorted(sketches)
    points = centred_points(np.stack([sketches[k] for k in client_ids]), mean)
    labels = nearest_centre(points, centres)
    groups = int(centres.shape[0])
    if membership == "soft" and groups >= 2:
        pairs = np.triu_indices(groups, k=1)
        spread = float(np.mean(np.sum((centres[:, None, :] - centres[None, :, :]) ** 2, axis=2)[pairs]))
        memberships = memberships_at(points, centres, max(float(temperature) * spread, 1e-8))
    else:
        memberships = hard_memberships(labels, groups)
    return PrivateGrouping(labels=labels, memberships=memberships, num_groups=groups, silhouette=silhouette(points, labels))
