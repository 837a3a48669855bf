"""What a partition produces: each client's sample indices, transform and true group."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hdcfl_ray.data.shifts import Shift


@dataclass(frozen=True)
class ClientData:
    client_id: int
    train_indices: np.ndarray  # int64 indices into the train split
    test_indices: np.ndarray  # int64 indices into the test split
    shift: Shift  # the feature shift applied to this client's train and test images alike
    true_group: int | None  # planted group (shift level index, class-set id) when one exists
    # the scored images are a held-out share of the client's own training images
    # (`partition.validation_fraction`): test_indices then index the train split
    test_from_train: bool = False

    @property
    def rotation_degrees(self) -> float:
        """The client's rotation in degrees (0 when its shift is not a rotation)."""
        return float(self.shift.level) if self.shift.transform == "rotation" else 0.0

    @property
    def num_train(self) -> int:
        return int(self.train_indices.shape[0])


@dataclass(frozen=True)
class Partition:
    clients: tuple[ClientData, ...]
    # each client's test images were drawn from the shared test split with its class
    # proportions (False: the partition chose them, e.g. a writer's own held-out samples)
    test_drawn_by_class: bool = True

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    def true_groups(self) -> np.ndarray | None:
        """Planted group per client, or None when the partition has no groups."""
        groups = [client.true_group for client in self.clients]
        if any(group is None for group in groups):
            return None
        return np.asarray(groups, dtype=np.int64)
