"""From a PartitionConfig and the dataset's labels to the Partition every client reads."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from hdcfl_ray import seeding
from hdcfl_ray.config.schema import PartitionConfig
from hdcfl_ray.data.partitions.client_data import ClientData, Partition
from hdcfl_ray.data.partitions.id_groups import groups_from_pattern
from hdcfl_ray.data.partitions.test_split import allocate_test_counts, draw_client_test_indices, indices_by_class
from hdcfl_ray.contract.data import SampleIds
from hdcfl_ray.data.dataset import ImageDataset
from hdcfl_ray.data.partitions.train_split import TrainSplit, sorted_int64
from hdcfl_ray.data.shifts import NO_SHIFT
from hdcfl_ray.errors import ScenarioError


def build_partition(
    config: PartitionConfig,
    train_labels: np.ndarray,
    test_labels: np.ndarray,
    num_classes: int,
    seed: int,
    ids: SampleIds | None = None,
) -> Partition:
    """Split the training labels over clients and draw each client's test set.

    The train split and each client's test draw use separate child seeds, so
    changing the test size never changes who trains on what. `ids`: who made each
    sample, for a partition that divides by them (natural_id, a plugin's with uses_ids).
    """
    train_labels = np.asarray(train_labels, dtype=np.int64)
    test_labels = np.asarray(test_labels, dtype=np.int64)
    for split_name, labels in (("train", train_labels), ("test", test_labels)):
        if labels.size and not 0 <= labels.min() <= labels.max() < num_classes:
            raise ValueError(f"{split_name} labels must lie in 0..{num_classes - 1}")
    train_seed, test_seed = seeding.data_streams(seed)
    try:
        split = _split_train(config, train_labels, np.random.default_rng(train_seed), ids)
    except ValueError as error:
        raise ScenarioError(f"partition ({config.kind}, num_clients {config.num_clients}): {error}") from error

    num_test = config.test_per_client or max(1, test_labels.shape[0] // config.num_clients)
    test_by_class = indices_by_class(test_labels, num_classes)
    client_test_seeds = test_seed.spawn(config.num_clients)

    whole_split = np.arange(test_labels.shape[0], dtype=np.int64)

    def test_indices(client: int, indices: np.ndarray) -> np.ndarray:
        if split.test_indices is not None:  # the partition chose them (a client's own held-out samples)
            return split.test_indices[client]
        if config.test_set == "whole_split":
            return whole_split.copy()
        return draw_client_test_indices(
            train_labels[indices], test_by_class, num_test, np.random.default_rng(client_test_seeds[client])
        )

    clients = tuple(
        ClientData(
            client_id=client,
            train_indices=indices,
            test_indices=test_indices(client, indices),
            shift=NO_SHIFT if split.shifts is None else split.shifts[client],
            true_group=None if split.true_groups is None else split.true_groups[client],
        )
        for client, indices in enumerate(split.client_indices)
    )
    if config.validation_fraction is not None:
        clients = tuple(
            _hold_out_validation(client, train_labels, config.validation_fraction, seed, config.validation_draw) for client in clients
        )
    return Partition(clients=clients, test_drawn_by_class=split.test_indices is None and config.test_set == "own_classes")


def _hold_out_validation(client: ClientData, train_labels: np.ndarray, fraction: float, seed: int, draw: int = 0) -> ClientData:
    """Move a seeded share of the client's training images, per class, into the
    images it is scored on: the run then never reads the test split.

    The share follows the client's class proportions (largest remainder); a class
    keeps at least one training image. The draw depends on the run seed and the
    client only, so the same client holds out the same images whatever the method;
    another `draw` holds out another seeded share of the same client."""
    indices = client.train_indices
    labels = train_labels[indices]
    counts = np.bincount(labels, minlength=int(train_labels.max(initial=0)) + 1)
    num_validation = max(1, round(fraction * indices.shape[0]))
    per_class = allocate_test_counts(counts, num_validation, np.maximum(counts - 1, 0))
    keys = (client.client_id,) if draw == 0 else (client.client_id, draw)
    rng = seeding.rng(seed, "validation_split", *keys)
    held_out = [
        rng.choice(indices[labels == label], size=int(count), replace=False) for label, count in enumerate(per_class) if count
    ]
    validation = np.sort(np.concatenate(held_out)).astype(np.int64) if held_out else np.empty(0, dtype=np.int64)
    if validation.shape[0] == 0:
        raise ScenarioError(
            f"partition.validation_fraction: client {client.client_id} holds {indices.shape[0]} training images, "
            "too few to hold any out (every class would lose its only image); use fewer clients or no validation split"
        )
    return replace(
        client,
        train_indices=np.setdiff1d(indices, validation, assume_unique=True).astype(np.int64),
        test_indices=validation,
        test_from_train=True,
    )


def _split_train(config: PartitionConfig, labels: np.ndarray, rng: np.random.Generator, ids: SampleIds | None) -> TrainSplit:
    from hdcfl_ray.data.partitions.registry import builtin_partitions, partition_spec

    try:
        spec = partition_spec(config.kind)
    except ValueError as error:
        raise ScenarioError(str(error)) from None
    extra: dict[str, SampleIds] = {}
    if spec.uses_ids:
        if ids is None:
            raise ScenarioError(
                f"partition.partition_by: partition {spec.name!r} divides the data by who made each sample; name the "
                "column that says so (e.g. writer_id) in partition.partition_by, with a source that has one "
                "(huggingface, parquet_images, text, leaf_json, shakespeare_plays)"
            )
        extra["ids"] = ids
    if spec.name in builtin_partitions():
        split = spec.split(config, labels, config.num_clients, rng, **extra)
    else:
        from hdcfl_ray.config.schema import plugin_section

        split = spec.split(plugin_section(config, spec), labels, config.num_clients, rng, **extra)
    if isinstance(split, TrainSplit):
        return split
    indices = tuple(sorted_int64(part) for part in split.client_indices)
    if len(indices) != config.num_clients:
        raise ValueError(f"partition {spec.name!r} returned {len(indices)} clients, not {config.num_clients}")
    if any(part.size and not 0 <= part.min() <= part.max() < labels.shape[0] for part in indices):
        raise ValueError(f"partition {spec.name!r} returned an index outside the {labels.shape[0]} training images")
    groups = split.true_groups
    test = getattr(split, "test_indices", None)
    if test is not None:
        test = tuple(sorted_int64(part) for part in test)
        num_test = ids.test.shape[0] if ids is not None else None
        if len(test) != len(indices) or (num_test is not None and any(part.size and part.max() >= num_test for part in test)):
            raise ValueError(f"partition {spec.name!r} returned test indices that are not one array per client inside the test split")
    return TrainSplit(
        client_indices=indices,
        true_groups=None if groups is None else tuple(int(group) for group in groups),
        shifts=getattr(split, "shifts", None),
        test_indices=test,
    )


def partition_dataset(config: PartitionConfig, dataset: ImageDataset, seed: int) -> Partition:
    """`build_partition` over a loaded dataset, with who made each sample when it knows."""
    ids = sample_ids(dataset)
    if ids is not None and config.group_pattern is not None:
        ids = groups_from_pattern(ids, config.group_pattern, config.partition_by or "ids")
    return build_partition(config, dataset.train_labels, dataset.test_labels, dataset.num_classes, seed, ids=ids)


def sample_ids(dataset: ImageDataset) -> SampleIds | None:
    """Who made each sample of `dataset`, when its source knows (None otherwise)."""
    if dataset.train_ids is not None and dataset.test_ids is not None:
        groups = dataset.id_groups or None  # the planted group of each id, when the source knows one
        return SampleIds(train=dataset.train_ids, test=dataset.test_ids, names=dataset.id_names, groups=groups)
    return None
