"""One HDC-FL refresh on the server's cache: descriptors, grouping, memberships,
prototypes and the grouping's silhouette (docs/hdcfl.md, sections 1-4).

The caller stacks the cache in a fixed client order (row k is the same client in
every array); `refresh_summary` maps the rows back to client ids. `run_refresh`
is the refresh a run makes at a refresh round, seeded from the run seed and the
refresh's index: the run (algorithms/hdcfl.py) and `ablate`'s replay
(ablation/replay.py) both call it, so a replay with the run's settings is the
run's refresh.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from hdcfl_ray import seeding
from hdcfl_ray.contract import RefreshSummary
from hdcfl_ray.diagnostics.clustering import silhouette
from hdcfl_ray.hdcfl.descriptors import lowrank_descriptors, raw_descriptors
from hdcfl_ray.hdcfl.grouping import group_clients
from hdcfl_ray.hdcfl.membership import hard_memberships, membership_temperature, soft_memberships
from hdcfl_ray.hdcfl.placement import GroupGeometry, geometry_of
from hdcfl_ray.hdcfl.prototypes import group_prototypes


class RefreshParams(Protocol):
    """The HDC-FL settings a refresh reads (algorithms/hdcfl.py's HDCFLParams fits)."""

    descriptor: str  # "lowrank" | "raw"
    rank: int
    groups: int
    membership: str  # "soft" | "hard"
    temperature: float
    temperature_scale: str  # "within" | "between"
    prototypes: str  # "hard" | "soft"
    kmeans_init: int


@dataclass(frozen=True)
class RefreshResult:
    """Everything one refresh decides; G = G_eff <= params.groups."""

    descriptors: np.ndarray  # (K, effective_rank)
    labels: np.ndarray  # (K,) int64, canonical
    centroids: np.ndarray  # (G, effective_rank)
    memberships: np.ndarray  # (K, G), rows sum to 1
    prototypes: np.ndarray  # (G, De) float32
    effective_rank: int
    silhouette: float  # NaN when undefined (G < 2 or G == K)
    # what places any other head among these groups as the cached heads were (placement.py)
    geometry: GroupGeometry | None = None


def refresh_groups(
    heads: np.ndarray, encoders: np.ndarray | Sequence[np.ndarray], sample_counts: np.ndarray, params: RefreshParams, seed: int
) -> RefreshResult:
    """Group the K cached clients by their heads and build one encoder prototype per group.

    `encoders` may be a (K, De) array or K vectors (the rows of a disk cache, read
    one at a time by `group_prototypes`)."""
    _check_params(params)
    head_stack = np.asarray(heads)
    encoder_stack = encoders if isinstance(encoders, np.ndarray) else list(encoders)
    num_encoders = len(encoder_stack)
    if head_stack.ndim != 2 or head_stack.shape[0] != num_encoders or (isinstance(encoder_stack, np.ndarray) and encoder_stack.ndim != 2):
        shape = encoder_stack.shape if isinstance(encoder_stack, np.ndarray) else f"{num_encoders} vectors"
        raise ValueError(f"heads {head_stack.shape} and encoders {shape} must be (K, Dh) and (K, De)")

    if params.descriptor == "lowrank":
        descriptors = lowrank_descriptors(head_stack, params.rank)
    else:
        descriptors = raw_descriptors(head_stack)
    grouping = group_clients(descriptors.vectors, params.groups, seed=seed, n_init=params.kmeans_init)
    num_groups = grouping.centroids.shape[0]
    one_hot = hard_memberships(grouping.labels, num_groups)

    if params.membership == "soft":
        memberships = soft_memberships(descriptors.vectors, grouping.centroids, grouping.labels, params.temperature, params.temperature_scale)
        temperature = membership_temperature(descriptors.vectors, grouping.centroids, grouping.labels, params.temperature, params.temperature_scale)
    else:
        memberships = one_hot
        temperature = float("nan")  # hard rows have none
    # Hard prototypes follow the k-means labels themselves, not the argmax of the
    # soft rows, which could differ on a tie.
    soft_prototypes = params.prototypes == "soft"
    prototypes = group_prototypes(encoder_stack, sample_counts, memberships if soft_prototypes else one_hot, soft=soft_prototypes)

    return RefreshResult(
        descriptors=descriptors.vectors,
        labels=grouping.labels,
        centroids=grouping.centroids,
        memberships=memberships,
        prototypes=prototypes,
        effective_rank=descriptors.effective_rank,
        silhouette=silhouette(descriptors.vectors, grouping.labels),
        geometry=geometry_of(descriptors, grouping.centroids, temperature, params.membership),
    )


def kmeans_seed(run_seed: int, refresh_index: int) -> int:
    """The k-means seed of a run's `refresh_index`-th refresh (0 for the first): its own
    named stream, so a run is reproducible and no two refreshes or seeds share one."""
    return seeding.int_seed(run_seed, "kmeans", refresh_index)


def run_refresh(
    heads: np.ndarray,
    encoders: np.ndarray | Sequence[np.ndarray],
    sample_counts: np.ndarray,
    params: RefreshParams,
    seed: int,
    refresh_index: int,
) -> RefreshResult:
    """The refresh of run `seed` at its `refresh_index`-th refresh round, on the cache
    stacked in client-id order (see `refresh_groups` for the arrays)."""
    counts = np.asarray(sample_counts, dtype=np.float64)
    return refresh_groups(heads, encoders, counts, params, seed=kmeans_seed(seed, refresh_index))


def refresh_summary(round_index: int, client_ids: Sequence[int], result: RefreshResult, descriptor: str) -> RefreshSummary:
    """What the refresh table logs of `result`, its rows mapped back to `client_ids`."""
    ids = [int(k) for k in client_ids]
    return RefreshSummary(
        round_index=round_index,
        group_labels={k: int(result.labels[i]) for i, k in enumerate(ids)},
        memberships={k: result.memberships[i] for i, k in enumerate(ids)},
        silhouette=float(result.silhouette),
        effective_rank=int(result.effective_rank),
        num_groups=int(result.prototypes.shape[0]),
        descriptor_kind=descriptor,
    )


def _check_params(params: RefreshParams) -> None:
    """Fail before any maths, naming the setting, its value and what is allowed."""
    choices = {"descriptor": ("lowrank", "raw"), "membership": ("soft", "hard"), "prototypes": ("hard", "soft")}
    for name, allowed in choices.items():
        value = getattr(params, name)
        if value not in allowed:
            raise ValueError(f"hdcfl.{name}: {value!r} is not one of {', '.join(allowed)}")
    for name in ("rank", "groups", "kmeans_init"):
        value = getattr(params, name)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"hdcfl.{name}: {value!r} must be a positive integer")
    if not params.temperature > 0:
        raise ValueError(f"hdcfl.temperature: {params.temperature!r} must be positive")
