"""Placing a head among a refresh's groups as the refresh placed the cached heads:
HDC-FL's newcomer rule (docs/newcomers.md) and its check on a client that trained.

A refresh keeps its `GroupGeometry`: the descriptor basis (the mean unit head and
the principal directions, descriptors.py), the group centres and the temperature T of
its soft memberships. `place_head` maps any head through them: its descriptor, its
group (the nearest centre, as k-means assigns) and its membership row (the softmax at
the refresh's T, or one-hot for hard memberships). For a head the refresh grouped it
returns that head's own stored row, up to rounding. Plain numpy: it runs in a client
host, on the geometry the server sends the newcomer."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hdcfl_ray.hdcfl.descriptors import Descriptors, describe_head
from hdcfl_ray.hdcfl.membership import hard_memberships, memberships_at


@dataclass(frozen=True)
class GroupGeometry:
    """What places a head among one refresh's groups."""

    head_mean: np.ndarray | None  # (Dh,) the mean unit head (lowrank); None for raw descriptors
    axes: np.ndarray | None  # (Dh, r) principal directions (lowrank); None for raw descriptors
    centroids: np.ndarray  # (G, r) the group centres in descriptor space
    temperature: float  # T of the soft rows (after the floor); unused for hard memberships
    membership: str  # "soft" | "hard"

    @property
    def num_groups(self) -> int:
        return int(self.centroids.shape[0])


@dataclass(frozen=True)
class Placement:
    """A head's place among the groups."""

    descriptor: np.ndarray  # (r,)
    group: int  # the nearest centre
    memberships: np.ndarray  # (G,) float64, summing to 1


def geometry_of(descriptors: Descriptors, centroids: np.ndarray, temperature: float, membership: str) -> GroupGeometry:
    """A refresh's geometry from its descriptors, centres and T."""
    return GroupGeometry(
        head_mean=None if descriptors.head_mean is None else np.asarray(descriptors.head_mean, dtype=np.float64),
        axes=None if descriptors.axes is None else np.asarray(descriptors.axes, dtype=np.float64),
        centroids=np.asarray(centroids, dtype=np.float64),
        temperature=float(temperature),
        membership=membership,
    )


def place_head(geometry: GroupGeometry, head: np.ndarray) -> Placement:
    """Where `head` ([W | b], flat) falls among the groups of `geometry`."""
    basis = Descriptors(vectors=np.zeros((0, 0)), effective_rank=0, head_mean=geometry.head_mean, axes=geometry.axes)
    descriptor = describe_head(basis, np.asarray(head, dtype=np.float64))
    if descriptor.shape[0] != geometry.centroids.shape[1]:
        raise ValueError(
            f"a head of length {np.size(head)} gives a descriptor of {descriptor.shape[0]} coordinates; "
            f"the groups' centres have {geometry.centroids.shape[1]}"
        )
    squared = np.sum((geometry.centroids - descriptor[None, :]) ** 2, axis=1)
    group = int(np.argmin(squared))
    if geometry.membership == "hard":
        row = hard_memberships(np.array([group]), geometry.num_groups)[0]
    else:
        row = memberships_at(descriptor[None, :], geometry.centroids, geometry.temperature)[0]
    return Placement(descriptor=descriptor, group=group, memberships=row)
