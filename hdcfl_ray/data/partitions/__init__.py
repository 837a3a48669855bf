"""Partitions: seeded splits of the training labels over clients, plus per-client test sets."""

from hdcfl_ray.data.partitions.build import build_partition, partition_dataset
from hdcfl_ray.data.partitions.checks import check_partition_against_dataset
from hdcfl_ray.data.partitions.client_data import ClientData, Partition
from hdcfl_ray.data.partitions.dirichlet import dirichlet_partition
from hdcfl_ray.data.partitions.iid import iid_partition
from hdcfl_ray.data.partitions.label_subset import label_subset_partition
from hdcfl_ray.data.partitions.rotation import rotation_partition
from hdcfl_ray.data.partitions.train_split import TrainSplit

__all__ = [
    "ClientData",
    "Partition",
    "TrainSplit",
    "build_partition",
    "partition_dataset",
    "check_partition_against_dataset",
    "dirichlet_partition",
    "iid_partition",
    "label_subset_partition",
    "rotation_partition",
]
