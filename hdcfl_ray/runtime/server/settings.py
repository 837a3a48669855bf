"""What a server is built with: the protocol, the client count and sizes, and each
client's profile on the virtual clock, taken from a scenario and its partition."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from hdcfl_ray.config.runtime_resolved import trains_batched
from hdcfl_ray.config.schema import ProtocolConfig
from hdcfl_ray.contract import ResolvedPrivacy
from hdcfl_ray.runtime.server.sampling import evaluation_sample
from hdcfl_ray.runtime.server.virtual_clock import ClientProfile, client_profiles


@dataclass(frozen=True)
class ServerSettings:
    num_clients: int
    clients_per_round: int
    seed: int
    protocol: ProtocolConfig
    client_train_sizes: tuple[int, ...]
    profiles: tuple[ClientProfile, ...]
    # the clients every evaluated round scores (protocol.eval_clients), in id order
    eval_client_ids: tuple[int, ...]
    # runtime.batched_training as resolved (auto: the hosts train on CUDA): a synchronous
    # round then sends each host its clients' jobs in one call, so they can train together
    batched_training: bool = False
    # partition.newcomers: the clients that never train, scored apart at every evaluated round
    # by the method's newcomer rule (`newcomer_rule`, None: it has none) with `newcomer_epochs`
    newcomers: tuple[int, ...] = ()
    newcomer_rule: str | None = None
    newcomer_epochs: int = 1
    # the scenario's privacy section as the run resolved it (runtime/privacy_plan.py): Poisson
    # sampling and the accounting of the method's releases; None = no privacy
    privacy: ResolvedPrivacy | None = None

    def training_clients(self, clients: list[int]) -> list[int]:
        """`clients` without the newcomers, in the same order (`clients` itself without any)."""
        if not self.newcomers:
            return clients
        held_out = set(self.newcomers)
        return [client_id for client_id in clients if client_id not in held_out]

    @cached_property
    def _availability_windows(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Each client's (available_from, available_until), or None when every client
        is available at all times (no trace): the common case costs nothing per round."""
        starts = np.array([profile.available_from for profile in self.profiles], dtype=np.float64)
        ends = np.array([profile.available_until for profile in self.profiles], dtype=np.float64)
        if not starts.any() and np.isinf(ends).all():
            return None
        return starts, ends

    def available_at(self, clients: list[int], virtual_time: float) -> list[int]:
        """The clients of `clients` whose availability window holds `virtual_time`."""
        windows = self._availability_windows
        if windows is None:
            return clients
        starts, ends = windows
        chosen = np.asarray(clients, dtype=np.int64)
        keep = (starts[chosen] <= virtual_time) & (virtual_time < ends[chosen])
        return chosen[keep].tolist()

    @property
    def rounds(self) -> int:
        return self.protocol.rounds


def build_server_settings(scenario: Any, partition: Any, privacy: ResolvedPrivacy | None = None) -> ServerSettings:
    """From a Scenario and a Partition (typed loosely: the server imports no data code), and
    the privacy the run resolved (PreparedRun.privacy)."""
    from hdcfl_ray.algorithms.registry import newcomer_rule
    from hdcfl_ray.data.partitions.newcomers import scenario_newcomers

    newcomers = scenario_newcomers(scenario)
    return ServerSettings(
        num_clients=partition.num_clients,
        clients_per_round=scenario.clients_per_round(),
        seed=scenario.seed,
        protocol=scenario.protocol,
        client_train_sizes=tuple(client.num_train for client in partition.clients),
        profiles=tuple(client_profiles(scenario.protocol.system, partition.num_clients, scenario.seed)),
        eval_client_ids=evaluation_sample(partition.num_clients, scenario.protocol.eval_clients, scenario.seed, newcomers),
        batched_training=trains_batched(scenario.runtime),
        newcomers=newcomers,
        newcomer_rule=newcomer_rule(scenario.algorithm.name),
        newcomer_epochs=scenario.protocol.newcomer_epochs,
        privacy=privacy,
    )
