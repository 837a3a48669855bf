"""Partition settings that cannot work for a given dataset, caught before any data is
split, and settings a partition can only honour in part (said, not hidden)."""

from __future__ import annotations

from hdcfl_ray.config.schema import PartitionConfig
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
