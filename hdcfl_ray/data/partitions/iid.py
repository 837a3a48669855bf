"""IID partition: a seeded shuffle cut into near-equal shares."""

from __future__ import annotations

import numpy as np

from hdcfl_ray.data.partitions.train_split import TrainSplit, sorted_int64


def iid_partition(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> TrainSplit:
    """Client shares differ in size by at most one sample."""
    if num_clients > labels.shape[0]:
        raise ValueError(f"{num_clients} clients but only {labels.shape[0]} training samples")
    shares = np.array_split(rng.permutation(labels.shape[0]), num_clients)
    return TrainSplit(client_indices=tuple(sorted_int64(share) for share in shares))
