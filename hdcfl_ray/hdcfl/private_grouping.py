"""HDC-FL's grouping under a `privacy` section (docs/privacy.md): the heads stay on the
clients, and the groups come from noised sums, never from any client's descriptor.

A client's head sketch is its unit head projected on `sketch_width` public orthonormal
directions (drawn from the run seed, the same for every client: the server reads no head to
fit them, unlike the low-rank descriptor's PCA); its norm is at most 1. Every head shares
a large common part (each has learnt the same classes), so, as the low-rank descriptor
centres the heads before its PCA, the sketches are centred: at each refresh the server first
releases the mean sketch (the sampled clients' noised sum of [sketch, 1] over its noised
count, one release) and each client's point is its sketch minus that mean, scaled to unit
norm. On the saved heads of three CIFAR-10 rotation runs (docs/privacy-sketch-check.md),
uncentred sketches of 8 coordinates leave k-means on them at an ARI of about 0.35 where the
heads' descriptors give 1.0; centred sketches of 64 coordinates give 0.9-1.0.

The groups are k-means on those points, made of releases of the sums-and-counts form (DP
k-means): in each, every sampled client adds [point, 1] to one bin, a vector of norm at
most sqrt(2), and the server releases every bin's sum with Gaussian noise, one Gaussian
mechanism of multiplier z whose noise is z sqrt(2) on every coordinate (times the noise
cohort's factor, as for the model's sums); the mean's release is the same mechanism.

- Seeding (one release): the bins are the 2w public signed axes (+e_i and -e_i of the
  sketch's w coordinates), each client in the axis nearest its point; the server runs
  k-means with restarts on the released bins' means, weighted by their noised counts (post-
  processing: no release), for the G starting centres. Lloyd's iteration from a fixed start
  stops in local optima (two groups merged, one split) that restarts would escape, and
  restarts on the clients' points would cost a release each; the bins give the server a
  noised summary of the points to restart on for free.
- Lloyd steps (`LLOYD_STEPS_PER_REFRESH` releases): the bins are the current centres, each
  client in the nearest; the new centres are the noised sums over the noised counts. A group
  whose noised count is below the minimum group size starts again from a fresh public
  direction (k-means' restart of a lost centre).

Where too few bins survive the noise for G centres, the seeding falls back on the last
refresh's centres (the first refresh's: public seeded directions).

Noise sets the width and the seeding (`sketch_plan`, from public values only: z, the noise
cohort's factor, the expected clients per round and G, never from a sketch). Every bin's
sum gets noise of norm sigma sqrt(w) (sigma = z sqrt(2) x the cohort's factor), so more
coordinates carry more of the heads' differences and more noise: the width is
w = (NOISE_TO_SIGNAL m / sigma)^2, m = expected clients per round / G (a group's expected
members), between MIN_SKETCH_WIDTH and `sketch_width`. The seeding's bins hold a client or
two each, so it runs only where a single client's bin keeps its noise norm within
SEEDING_NOISE times its own signal (sigma sqrt(w + 1) <= SEEDING_NOISE); otherwise its
release goes to one more Lloyd step. The constants come from a grid over sigma (0.02 to
0.85) on the saved heads of a digits and a CIFAR-10 rotation run.

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

# Lloyd steps a refresh round runs after its seeding: each one release the accountant counts
LLOYD_STEPS_PER_REFRESH = 2
# a refresh's releases on the sketches: the mean sketch, the seeding bins (or one more Lloyd step), the Lloyd steps
SKETCH_RELEASES_PER_REFRESH = 1 + 1 + LLOYD_STEPS_PER_REFRESH
# k-means restarts on the released seeding bins (post-processing)
SEEDING_RESTARTS = 10
# the sketch's width: noise on each coordinate of a group's sum at most this share of its expected members
NOISE_TO_SIGNAL = 0.2
MIN_SKETCH_WIDTH = 8
# the seeding runs where a single client's bin keeps its noise norm at most this multiple of its signal
SEEDING_NOISE = 1.5


@dataclass(frozen=True)
class SketchPlan:
    """What a private run's refreshes release about the heads, chosen from public values."""

    width: int
    seeding: bool


def sketch_plan(max_width: int, groups: int, sum_noise_std: float, expected_clients: float, head_length: int | None = None) -> SketchPlan:
    """The sketch's width and whether the seeding runs (module docstring), for noise of std
    `sum_noise_std` on every coordinate of a bin's sum and `expected_clients` a round; the
    width at most `max_width` and the head's length (when known)."""
    cap = max(1, int(max_width) if head_length is None else min(int(max_width), int(head_length)))
    members = float(expected_clients) / max(1, int(groups))
    if sum_noise_std <= 0.0:
        width = cap
    else:
        width = min(cap, max(MIN_SKETCH_WIDTH, int((NOISE_TO_SIGNAL * members / float(sum_noise_std)) ** 2)))
    return SketchPlan(width=width, seeding=bool(float(sum_noise_std) * np.sqrt(width + 1) <= SEEDING_NOISE))


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


def bin_noise_std(noise_multiplier: float, noise_factor: float) -> float:
    """The noise on every coordinate of a bin's sum of [point, 1] (norm at most sqrt(2)):
    `noise_multiplier` * sqrt(2) * `noise_factor` (the noise cohort's share)."""
    return float(noise_multiplier) * float(np.sqrt(2.0)) * float(noise_factor)


def released_sketch_mean(sketches: np.ndarray, noise_multiplier: float, noise_factor: float, rng: np.random.Generator) -> np.ndarray:
    """The sampled clients' mean sketch as one Gaussian release: every sketch in one bin
    (`noised_bins`), its noised sum over its noised count; zeros when that count is below 1."""
    sketches = np.asarray(sketches, dtype=np.float64)
    sums, counts = noised_bins(sketches, np.zeros(len(sketches), dtype=np.int64), 1, bin_noise_std(noise_multiplier, noise_factor), rng)
    return sums[0] / counts[0] if counts[0] >= 1.0 else np.zeros(sketches.shape[1])


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


def noised_bins(points: np.ndarray, labels: np.ndarray, bins: int, std: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One Gaussian release: every bin's sum of [point, 1] over the points in it, each
    coordinate with N(0, std^2); the noised sums (bins, w) and noised counts (bins,)."""
    width = int(points.shape[1])
    sums, counts = np.zeros((bins, width)), np.zeros(bins)
    for b in range(bins):
        members = [np.concatenate([points[i], [1.0]]) for i in np.flatnonzero(labels == b)]
        total = noised_sum(members, std, rng, size=width + 1).astype(np.float64)
        sums[b], counts[b] = total[:-1], total[-1]
    return sums, counts


def seeded_centres(
    points: np.ndarray, fallback: np.ndarray, noise_multiplier: float, noise_factor: float, min_group_size: int, seed: int, rng: np.random.Generator
) -> np.ndarray:
    """The G starting centres of a refresh: one release of the points binned by the public
    signed axes, then weighted k-means with restarts on the bins' noised means; `fallback`
    where fewer than G bins keep a noised count of at least max(1, min_group_size)."""
    groups, width = fallback.shape
    std = bin_noise_std(noise_multiplier, noise_factor)
    axes = np.concatenate([np.eye(width), -np.eye(width)])
    labels = nearest_centre(points, axes) if len(points) else np.zeros(0, dtype=np.int64)
    sums, counts = noised_bins(points, labels, len(axes), std, rng)
    kept = counts >= max(1, min_group_size)
    if int(np.sum(kept)) < groups:
        return np.asarray(fallback, dtype=np.float64).copy()
    from sklearn.cluster import KMeans  # imported on use, as hdcfl/grouping.py does

    means = sums[kept] / counts[kept, None]
    kmeans = KMeans(n_clusters=groups, init="k-means++", n_init=SEEDING_RESTARTS, random_state=int(seed) % (2**32))
    return np.asarray(kmeans.fit(means, sample_weight=counts[kept]).cluster_centers_, dtype=np.float64)


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
    norm at most 1): each step one Gaussian release of the groups' [sum of points, count]
    with std `noise_multiplier` * sqrt(2) * `noise_factor`, drawn from its own generator; a
    group whose noised count is below max(1, `min_group_size`) restarts from a fresh public
    direction drawn from that generator."""
    current = np.asarray(centres, dtype=np.float64).copy()
    groups, width = current.shape
    std = bin_noise_std(noise_multiplier, noise_factor)
    counts = np.zeros(groups)
    for step in range(steps):
        labels = nearest_centre(sketches, current) if len(sketches) else np.zeros(0, dtype=np.int64)
        sums, counts = noised_bins(sketches, labels, groups, std, rngs[step])
        for group in range(groups):
            if counts[group] >= max(1, min_group_size):
                current[group] = sums[group] / counts[group]
            else:  # a lost centre starts again from a fresh public direction, as k-means restarts one
                current[group] = unit_normalise(rngs[step].standard_normal((1, width)))[0]
    return LloydRelease(centres=current, counts=counts)


@dataclass(frozen=True)
class SketchRelease:
    """What a refresh releases of the sketches: their mean and the groups' centres."""

    mean: np.ndarray  # (w,)
    centres: np.ndarray  # (G, w)
    counts: np.ndarray  # (G,) noised counts of the last Lloyd step


def released_grouping(
    sketches: np.ndarray,
    previous: np.ndarray,
    noise_multiplier: float,
    noise_factor: float,
    min_group_size: int,
    kmeans_seed: int,
    rngs: list[np.random.Generator],
    seeding: bool = True,
) -> SketchRelease:
    """A refresh's `SKETCH_RELEASES_PER_REFRESH` releases on the sampled clients' raw
    `sketches`, one generator each in `rngs`: the mean sketch, the seeding bins from which
    the starting centres come (`previous` where too few bins survive; without `seeding`, a
    Lloyd step from `previous` instead), the Lloyd steps."""
    if len(rngs) != SKETCH_RELEASES_PER_REFRESH:
        raise ValueError(f"rngs: {len(rngs)} generators for {SKETCH_RELEASES_PER_REFRESH} releases")
    mean = released_sketch_mean(sketches, noise_multiplier, noise_factor, rngs[0])
    points = centred_points(sketches, mean)
    if seeding:
        start = seeded_centres(points, previous, noise_multiplier, noise_factor, min_group_size, kmeans_seed, rngs[1])
        lloyd = private_lloyd(points, start, LLOYD_STEPS_PER_REFRESH, noise_multiplier, noise_factor, min_group_size, rngs[2:])
    else:  # the seeding's release goes to one more Lloyd step
        lloyd = private_lloyd(points, previous, 1 + LLOYD_STEPS_PER_REFRESH, noise_multiplier, noise_factor, min_group_size, rngs[1:])
    return SketchRelease(mean=mean, centres=lloyd.centres, counts=lloyd.counts)


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
