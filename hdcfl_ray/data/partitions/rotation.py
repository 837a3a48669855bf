"""Feature-shift partitions: IID data, clients in groups that each see their images
through one transform at one level (rotation: at one angle)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hdcfl_ray.data.partitions.iid import iid_partition
from hdcfl_ray.data.partitions.train_split import TrainSplit
from hdcfl_ray.data.shifts import Shift


def feature_shift_partition(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, transform: str, levels: Sequence[float]
) -> TrainSplit:
    """Client i is in group i mod G and sees its images through `transform` at levels[i mod G]."""
    if len(levels) == 0:
        raise ValueError(f"{transform} needs at least one level")
    groups = tuple(client % len(levels) for client in range(num_clients))
    return TrainSplit(
        client_indices=iid_partition(labels, num_clients, rng).client_indices,
        true_groups=groups,
        shifts=tuple(Shift(transform, float(levels[group])) for group in groups),
    )


def rotation_partition(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, angles: Sequence[float]
) -> TrainSplit:
    """Client i is in group i mod G and rotates its images by angles[i mod G]."""
    if len(angles) == 0:
        raise ValueError("rotation needs at least one angle")
    return feature_shift_partition(labels, num_clients, rng, "rotation", angles)
