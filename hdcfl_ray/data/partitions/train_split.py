"""What every partitioner returns: the clients' training indices and what is planted in them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TrainSplit:
    """One sorted int64 index array per client into the training split.

    `true_groups` is the planted group per client when the partition has one;
    `rotation_degrees` is each client's rotation when the partition rotates data.
    """

    client_indices: tuple[np.ndarray, ...]
    true_groups: tuple[int, ...] | None = None
    rotation_degrees: tuple[float, ...] | None = None

    @property
    def num_clients(self) -> int:
        return len(self.client_indices)


def sorted_int64(indices: np.ndarray) -> np.ndarray:
    return np.sort(np.asarray(indices, dtype=np.int64))
