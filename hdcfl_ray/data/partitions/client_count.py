"""`partition.num_clients: all` (and `sample_fraction`) resolved against the data: how many
clients a natural partition makes once the ids are read.

A natural partition (`natural_id`) chooses its ids in one seeded order (the first draw of
the partition's training stream, `natural_id.id_order`). Every id with at least
`min_samples` training samples is eligible; `all` takes every one of them, and
`sample_fraction` takes ids in that order until their samples (training and test, as LEAF
counts a user's samples before its train/test split) reach the share of all eligible ids'
samples, the id that crosses the share included: LEAF's `--sf` for its non-IID sample.
Ids are grouped `ids_per_client` to a client; a remainder that cannot fill a client is
left out."""

from __future__ import annotations

import math

import numpy as np

from hdcfl_ray import seeding
from hdcfl_ray.config.schema import PartitionConfig
from hdcfl_ray.contract.data import SampleIds
from hdcfl_ray.data.partitions.natural_id import eligible_ids, id_order, loosen_rule, size_rule
from hdcfl_ray.errors import ScenarioError


def resolved_client_count(config: PartitionConfig, ids: SampleIds | None, seed: int) -> tuple[int, str]:
    """The client count `num_clients: all` stands for, and a line saying how it was found."""
    if ids is None:
        raise ScenarioError(
            "partition.num_clients: all counts the ids of the data, and this dataset has no id column "
            "(set dataset.id_column or partition.partition_by to who made each sample, or give a count)"
        )
    eligible = eligible_ids(ids, config.min_samples, config.max_samples)
    rule = size_rule(config.min_samples, config.max_samples)
    if eligible.shape[0] < config.ids_per_client:
        raise ScenarioError(
            f"partition.num_clients: all: {eligible.shape[0]} of the {len(ids.names)} ids of column "
            f"{config.partition_by!r} have {rule}, fewer than partition.ids_per_client ({config.ids_per_client}); "
            + loosen_rule(config.max_samples)
        )
    if config.sample_fraction is None:
        count = eligible.shape[0] // config.ids_per_client
        return count, (
            f"partition.num_clients: all = {count} clients: the {eligible.shape[0]} ids of column "
            f"{config.partition_by!r} with {rule}"
            + (f", {config.ids_per_client} to a client" if config.ids_per_client > 1 else "")
            + (f" ({len(ids.names) - eligible.shape[0]} other ids left out)" if eligible.shape[0] < len(ids.names) else "")
        )
    samples = np.bincount(ids.train, minlength=len(ids.names)) + np.bincount(ids.test, minlength=len(ids.names))
    ordered = id_order(eligible, np.random.default_rng(seeding.data_streams(seed)[0]))
    cumulative = np.cumsum(samples[ordered])
    target = config.sample_fraction * float(cumulative[-1])
    taken = int(np.searchsorted(cumulative, target, side="left")) + 1  # the id that reaches the share included
    count = min(eligible.shape[0] // config.ids_per_client, max(1, math.ceil(taken / config.ids_per_client)))
    held = int(cumulative[count * config.ids_per_client - 1])
    return count, (
        f"partition.sample_fraction {config.sample_fraction:g}: {count} clients, {count * config.ids_per_client} of the "
        f"{eligible.shape[0]} eligible ids of column {config.partition_by!r} in seeded order, holding {held} of their "
        f"{int(cumulative[-1])} samples ({100.0 * held / cumulative[-1]:.1f}%)"
    )
