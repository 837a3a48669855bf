"""Partition settings that cannot work for a given dataset, caught before any data is
split, and settings a partition can only honour in part (said, not hidden)."""

from __future__ import annotations

import numpy as np

from hdcfl_ray.config.schema import DatasetConfig, PartitionConfig
from hdcfl_ray.data.dataset import ImageDataset
from hdcfl_ray.data.partitions.client_data import Partition
from hdcfl_ray.errors import ScenarioError


def check_partition_against_dataset(
    config: PartitionConfig, num_classes: int, num_train: int, dataset_name: str = "the dataset"
) -> None:
    """Raise ScenarioError naming the partition key, its value and the allowed range."""
    if config.num_clients > num_train:
        raise ScenarioError(
            f"partition.num_clients: {config.num_clients} is more than the {num_train} training samples "
            f"of {dataset_name} (choose 1..{num_train})"
        )
    if config.kind == "label_subset" and config.k is not None and config.k > num_classes:
        raise ScenarioError(
            f"partition.k: {config.k} is more than the {num_classes} classes of {dataset_name} "
            f"(choose 1..{num_classes})"
        )
    if config.kind == "dirichlet" and config.min_samples * config.num_clients > num_train:
        raise ScenarioError(
            f"partition.min_samples: {config.min_samples} samples for each of {config.num_clients} clients "
            f"needs {config.min_samples * config.num_clients}, more than the {num_train} training samples of "
            f"{dataset_name} (choose partition.min_samples 1..{num_train // config.num_clients} "
            f"or fewer partition.num_clients)"
        )


def id_column_notices(partition: PartitionConfig, dataset: DatasetConfig) -> list[str]:
    """A notice when `partition.partition_by` names the column of the labels: every id is
    then one class, so each client holds only the classes of its ids, a split by label
    that looks like a natural one."""
    label_columns = {
        "huggingface": ("dataset.label_column", dataset.label_column),
        "parquet_images": ("dataset.label_column", dataset.label_column),
        "text": ("dataset.target_column", dataset.target_column),  # the next character is the class
    }
    key, column = label_columns.get(dataset.name, ("", None))
    if partition.partition_by is None or partition.partition_by != column:
        return []
    holds = "one class" if partition.ids_per_client == 1 else f"at most {partition.ids_per_client} classes (partition.ids_per_client)"
    return [
        f"partition.partition_by: {column!r} is {key}, the class of each sample, so each client then holds {holds}: "
        "a split by label, not by who made the samples. Name the column of the writer, speaker or user ids (e.g. "
        "writer_id), or for a few classes per client use partition.kind: label_subset with partition.k"
    ]


def test_size_notices(config: PartitionConfig, partition: Partition) -> list[str]:
    """A notice when `partition.test_per_client` asks for more test images than some
    clients can draw from the test images of their own classes (they get fewer)."""
    if config.test_per_client is None:
        return []
    sizes = [int(client.test_indices.shape[0]) for client in partition.clients]
    capped = [size for size in sizes if size < config.test_per_client]
    if not capped:
        return []
    received = f"{min(capped)}" if min(capped) == max(capped) else f"{min(capped)} to {max(capped)}"
    return [
        f"partition.test_per_client: {config.test_per_client} is more than the test split holds for the classes of "
        f"{len(capped)} of {len(sizes)} clients; they get {received} test images each (capped)"
    ]


def test_proportion_notices(partition: Partition, dataset: ImageDataset) -> list[str]:
    """A notice when the test split holds too few images of a class for some clients'
    test sets to follow their class proportions: what a class cannot supply comes from
    the client's other classes, so those clients are tested on another mix than they
    train on. Says how many, the largest departure and the test size that keeps every
    client's proportions."""
    drawn = [client for client in partition.clients if not client.test_from_train]
    if not partition.test_drawn_by_class or not drawn:
        return []
    num_classes = dataset.num_classes
    train = _class_counts([dataset.train_labels[client.train_indices] for client in drawn], num_classes)
    test = _class_counts([dataset.test_labels[client.test_indices] for client in drawn], num_classes)
    shares = train / np.maximum(train.sum(axis=1, keepdims=True), 1)
    sizes = test.sum(axis=1)
    # test images a class gave short of its share (rounding moves less than one image per class)
    short = np.maximum(shares * sizes[:, None] - test, 0.0)
    moved = np.where(short >= 1.0, short, 0.0).sum(axis=1)
    departed = np.flatnonzero(moved >= 1.0)
    if departed.size == 0:
        return []
    worst = int(departed[np.argmax(moved[departed])])
    capacity = np.bincount(dataset.test_labels, minlength=num_classes).astype(np.float64)
    # the largest size whose share of every class fits the class's test images (share x size <= images
    # means its rounded count fits too)
    fits = np.where(shares > 0, np.floor(capacity / np.where(shares > 0, shares, 1.0) + 1e-9), np.inf)
    largest = int(fits.min())
    remedy = (
        f"partition.test_per_client: {largest} or less keeps every client's proportions"
        if largest >= 1
        else "no test size keeps every client's proportions (a class they train on has no test images)"
    )
    return [
        f"partition: the test split holds too few images of some classes for the test sets of {departed.size} of "
        f"{len(drawn)} clients to follow their class proportions; the rest come from their other classes "
        f"(most at client {drawn[worst].client_id}: {round(float(moved[worst]))} of its {int(sizes[worst])} test images). "
        f"{remedy}"
    ]


def _class_counts(label_sets: list[np.ndarray], num_classes: int) -> np.ndarray:
    """(sets, classes) counts of each class in each set of labels."""
    if not label_sets:
        return np.zeros((0, num_classes))
    owner = np.repeat(np.arange(len(label_sets)), [labels.shape[0] for labels in label_sets])
    labels = np.concatenate(label_sets).astype(np.int64)
    return np.bincount(owner * num_classes + labels, minlength=len(label_sets) * num_classes).reshape(-1, num_classes).astype(np.float64)


def check_text_unshifted(config: PartitionConfig, partition: Partition, dataset: ImageDataset) -> None:
    """A feature shift (a rotation, noise, blur) acts on pixels; on character sequences it
    would scramble the text. Refused there."""
    if not dataset.text:
        return
    shifted = [client.client_id for client in partition.clients if not client.shift.is_identity()]
    if shifted:
        raise ScenarioError(
            f"partition.kind: {config.kind} shifts the images of {len(shifted)} clients, and {dataset.name} holds text "
            "(character sequences, not pixels); use natural_id, iid, dirichlet or label_subset"
        )
