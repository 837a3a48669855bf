"""What every partitioner returns: the clients' training indices and what is planted in them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hdcfl_ray.data.shifts import Shift


@dataclass(frozen=True)
class TrainSplit:
    """One sorted int64 index array per client into the training split.

    `true_groups` is the planted group per client when the partition has one;
    `shifts` is each client's feature shift when the partition shifts features;
    `test_indices` each client's own test samples when the partition chooses them.
    """

    client_indices: tuple[np.ndarray, ...]
    true_groups: tuple[int, ...] | None = None
    shifts: tuple[Shift, ...] | None = None
    test_indices: tuple[np.ndarray, ...] | None = None

    @property
    def rotation_degrees(self) -> tuple[float, ...] | None:
        """Each client's rotation in degrees when the partition rotates data."""
        if self.shifts is None or any(shift.transform != "rotation" for shift in self.shifts):
            return None
        return tuple(float(shift.level) for shift in self.shifts)

    @property
    def num_clients(self) -> int:
        return len(self.client_indices)


def sorted_int64(indices: np.ndarray) -> np.ndarray:
    return np.sort(np.asarray(indices, dtype=np.int64))
