"""Which clients are newcomers (`partition.newcomers`): a seeded choice among the
clients of any partition, planted or natural, made after the partition is drawn, so
a newcomer's data is drawn exactly as every client's (a planted group holds for it
too) and the choice changes no other client's data. Newcomers never train; each
method scores them by its own rule (docs/newcomers.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hdcfl_ray import seeding

if TYPE_CHECKING:
    from hdcfl_ray.config.schema import Scenario


def newcomer_ids(num_clients: int, count: int, seed: int) -> tuple[int, ...]:
    """`count` distinct client ids of `num_clients`, in id order, drawn from the seed's
    own stream (the same seed gives the same newcomers); () for a count of 0."""
    if count <= 0:
        return ()
    if count >= num_clients:
        raise ValueError(f"partition.newcomers: {count} newcomers leave none of the {num_clients} clients to train")
    chosen = seeding.rng(seed, "newcomers").choice(num_clients, size=count, replace=False)
    return tuple(sorted(int(client_id) for client_id in chosen))


def scenario_newcomers(scenario: Scenario) -> tuple[int, ...]:
    """The newcomers of a Scenario whose client count is known (num_clients resolved)."""
    partition = scenario.partition
    if partition.newcomers is None:
        return ()
    return newcomer_ids(partition.client_count(), partition.newcomer_count(), scenario.seed)
