"""Rotation partition: IID data, clients in groups that each see the images at one angle."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hdcfl_ray.data.partitions.iid import iid_partition
from hdcfl_ray.data.partitions.train_split import TrainSplit


def rotation_partition(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, angles: Sequence[float]
) -> TrainSplit:
    """Client i is in group i mod G and rotates its images by angles[i mod G]."""
    if len(angles) == 0:
        raise ValueError("rotation needs at least one angle")
    groups = tuple(client % len(angles) for client in range(num_clients))
    return TrainSplit(
        client_indices=iid_partition(labels, num_clients, rng).client_indices,
        true_groups=groups,
        rotation_degrees=tuple(float(angles[group]) for group in groups),
    )
