"""The partitions there are: the built-in ones declared here and those of plugins,
each a `PartitionSpec`. A built-in partition reads the shared keys of the scenario's
`partition` section; a plugin's reads its own section, `partition.<name>` (a plugin
without parameters gets the `partition` section itself)."""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from hdcfl_ray.contract.data import PartitionSpec, SampleIds
from hdcfl_ray.data.partitions.dirichlet import dirichlet_partition
from hdcfl_ray.data.partitions.iid import iid_partition
from hdcfl_ray.data.partitions.label_subset import label_subset_partition
from hdcfl_ray.data.partitions.natural_id import natural_id_partition
from hdcfl_ray.data.partitions.rotation import feature_shift_partition, rotation_partition


def _iid(config: Any, labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> Any:
    return iid_partition(labels, num_clients, rng)


def _label_subset(config: Any, labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> Any:
    assert config.k is not None  # the schema requires k for label_subset
    return label_subset_partition(labels, num_clients, rng, config.k, config.label_assignment)


def _dirichlet(config: Any, labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> Any:
    assert config.alpha is not None  # the schema requires alpha for dirichlet
    return dirichlet_partition(labels, num_clients, rng, config.alpha, config.min_samples, balance=config.dirichlet_balance)


def _rotation(config: Any, labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> Any:
    return rotation_partition(labels, num_clients, rng, config.angles)


def _feature_shift(config: Any, labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> Any:
    return feature_shift_partition(labels, num_clients, rng, config.transform, config.levels)


def _natural_id(config: Any, labels: np.ndarray, num_clients: int, rng: np.random.Generator, ids: SampleIds) -> Any:
    return natural_id_partition(
        ids, num_clients, config.ids_per_client, config.min_samples, config.partition_by, rng, config.max_samples
    )


BUILTIN_PARTITIONS: tuple[PartitionSpec, ...] = (
    PartitionSpec("iid", "every client draws uniformly from the training split", _iid),
    PartitionSpec("label_subset", "each client holds exactly k classes (partition.k, label_assignment)", _label_subset),
    PartitionSpec("dirichlet", "class shares per client from Dirichlet(alpha) (partition.alpha, min_samples)", _dirichlet),
    PartitionSpec("rotation", "IID data; group i mod G rotates its images by partition.angles[i mod G]", _rotation),
    PartitionSpec(
        "feature_shift",
        "IID data; group i mod G sees its images through partition.transform at partition.levels[i mod G]",
        _feature_shift,
    ),
    PartitionSpec(
        "natural_id",
        "each client holds the samples of its own ids (partition.partition_by: writers, speaking roles, users)",
        _natural_id,
        uses_ids=True,
    ),
)


@cache
def builtin_partitions() -> dict[str, PartitionSpec]:
    return {spec.name: spec for spec in BUILTIN_PARTITIONS}


def partition_specs() -> dict[str, PartitionSpec]:
    from hdcfl_ray.plugins import merged

    return merged("partitions", builtin_partitions())


def partition_spec(name: str) -> PartitionSpec:
    specs = partition_specs()
    if name not in specs:
        raise ValueError(f"partition.kind: {name!r} is not a partition; choose from {', '.join(specs)}")
    return specs[name]
