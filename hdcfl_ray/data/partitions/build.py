"""From a PartitionConfig and the dataset's labels to the Partition every client reads."""

from __future__ import annotations

import numpy as np

from hdcfl_ray import seeding
from hdcfl_ray.config.schema import PartitionConfig
from hdcfl_ray.data.partitions.client_data import ClientData, Partition
from hdcfl_ray.data.partitions.dirichlet import dirichlet_partition
from hdcfl_ray.data.partitions.iid import iid_partition
from hdcfl_ray.data.partitions.label_subset import label_subset_partition
from hdcfl_ray.data.partitions.rotation import rotation_partition
from hdcfl_ray.data.partitions.test_split import draw_client_test_indices, indices_by_class
from hdcfl_ray.data.partitions.train_split import TrainSplit
from hdcfl_ray.errors import ScenarioError


def build_partition(
    config: PartitionConfig,
    train_labels: np.ndarray,
    test_labels: np.ndarray,
    num_classes: int,
    seed: int,
) -> Partition:
    """Split the training labels over clients and draw each client's test set.

    The train split and each client's test draw use separate child seeds, so
    changing the test size never changes who trains on what.
    """
    train_labels = np.asarray(train_labels, dtype=np.int64)
    test_labels = np.asarray(test_labels, dtype=np.int64)
    for split_name, labels in (("train", train_labels), ("test", test_labels)):
        if labels.size and not 0 <= labels.min() <= labels.max() < num_classes:
            raise ValueError(f"{split_name} labels must lie in 0..{num_classes - 1}")
    train_seed, test_seed = seeding.data_streams(seed)
    try:
        split = _split_train(config, train_labels, np.random.default_rng(train_seed))
    except ValueError as error:
        raise ScenarioError(f"partition ({config.kind}, num_clients {config.num_clients}): {error}") from error

    num_test = config.test_per_client or max(1, test_labels.shape[0] // config.num_clients)
    test_by_class = indices_by_class(test_labels, num_classes)
    client_test_seeds = test_seed.spawn(config.num_clients)
    clients = tuple(
        ClientData(
            client_id=client,
            train_indices=indices,
            test_indices=draw_client_test_indices(
                train_labels[indices], test_by_class, num_test, np.random.default_rng(client_test_seeds[client])
            ),
            rotation_degrees=0.0 if split.rotation_degrees is None else split.rotation_degrees[client],
            true_group=None if split.true_groups is None else split.true_groups[client],
        )
        for client, indices in enumerate(split.client_indices)
    )
    return Partition(clients=clients)


def _split_train(config: PartitionConfig, labels: np.ndarray, rng: np.random.Generator) -> TrainSplit:
    if config.kind == "iid":
        return iid_partition(labels, config.num_clients, rng)
    if config.kind == "label_subset":
        assert config.k is not None  # the schema requires k for label_subset
        return label_subset_partition(labels, config.num_clients, rng, config.k, config.label_assignment)
    if config.kind == "dirichlet":
        assert config.alpha is not None  # the schema requires alpha for dirichlet
        return dirichlet_partition(
            labels, config.num_clients, rng, config.alpha, config.min_samples, balance=config.dirichlet_balance
        )
    if config.kind == "rotation":
        return rotation_partition(labels, config.num_clients, rng, config.angles)
    raise ScenarioError(f"partition.kind: unknown partition {config.kind!r}")
