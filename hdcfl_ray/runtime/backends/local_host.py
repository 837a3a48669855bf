"""The local backend's in-process hosts: plain `ClientHost` objects, and the run's
server (synchronous or asynchronous) reaching them inside this process, with no
Ray: one host by direct calls (`InProcessTransport`), several side by side on a
thread each (`ThreadedTransport`).

`in_process_run` builds a run's server and hosts: the local backend
(`local_backend.LocalBackend`, what `runtime.backend: local` and most laptop runs
use) runs every round through it, and method tests run rounds through it
directly (one host). `local_host` builds the host alone, for work that needs clients but no
server: `hdcfl-ray ablate` replays saved refreshes through it, and
`hdcfl-ray diagnose donor-swap` scores encoders through it (one per Ray task when
spread over workers).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from hdcfl_ray.config.methods import build_algorithm
from hdcfl_ray.contract import Method, ModelParams
from hdcfl_ray.runtime.client.client_host import ClientHost
from hdcfl_ray.runtime.initial_model import independent_initialisations, initial_parameters
from hdcfl_ray.runtime.server.async_server import AsyncFederatedServer
from hdcfl_ray.runtime.server.round_tail import RoundReport
from hdcfl_ray.runtime.server.settings import build_server_settings
from hdcfl_ray.runtime.server.sync_server import FederatedServer
from hdcfl_ray.runtime.backends.placement import assign_clients
from hdcfl_ray.runtime.server.thread_transport import ThreadedTransport
from hdcfl_ray.runtime.server.transport import InProcessTransport


@dataclass
class InProcessRun:
    """A run's server and its hosts; the local backend calls the server's methods,
    tests step through rounds with `run_round` and `run_all`."""

    server: FederatedServer
    algorithm: Method
    hosts: list[ClientHost]  # client -> host index: server.client_hosts

    @property
    def host(self) -> ClientHost:
        """The first host (with one host: the host of every client)."""
        return self.hosts[0]

    def close(self) -> None:
        close = getattr(self.server.transport, "close", None)
        if close is not None:
            close()

    def run_round(self, round_index: int) -> RoundReport:
        return self.server.run_round(round_index)

    def run_all(self) -> list[RoundReport]:
        return [self.run_round(t) for t in range(1, self.server.rounds + 1)]


def local_host(
    prepared, algorithm: Method | None = None, initial: ModelParams | None = None, clients: list | None = None, cuda_index: int | None = None
) -> ClientHost:
    """One plain ClientHost owning every client of a `driver.PreparedRun` (or `clients`),
    built with the run's method and initial weights unless given; a CUDA host trains on
    GPU `cuda_index` (default the first)."""
    scenario, dataset = prepared.scenario, prepared.dataset
    return ClientHost(
        scenario,
        algorithm or build_algorithm(scenario, prepared.privacy),
        dataset.train_images,
        dataset.train_labels,
        dataset.test_images,
        dataset.test_labels,
        list(prepared.partition.clients) if clients is None else clients,
        initial or initial_parameters(scenario, dataset),
        dataset.num_classes,
        cuda_index=cuda_index,
    )


def in_process_run(prepared, algorithm: Method | None = None, hosts: int = 1, devices: list[int | None] | None = None) -> InProcessRun:
    """The server of a `driver.PreparedRun` (asynchronous if its protocol says so)
    and `hosts` hosts owning contiguous blocks of clients, as Ray's hosts do, ready
    for round 1; `devices` gives each host's CUDA device (placement.local_host_devices).
    Each extra host gets its own copy of the method (as an actor gets its own), so no
    method object is shared between threads."""
    scenario = prepared.scenario
    dataset = prepared.dataset
    algorithm = algorithm or build_algorithm(scenario, prepared.privacy)
    initial = initial_parameters(scenario, dataset)
    independent = independent_initialisations(scenario, dataset, algorithm.independent_inits)
    settings = build_server_settings(scenario, prepared.partition, prepared.privacy)
    count = max(1, min(hosts, settings.num_clients))
    client_hosts = assign_clients(settings.num_clients, count)
    clients_of_host: list[list] = [[] for _ in range(count)]
    for client in prepared.partition.clients:
        clients_of_host[client_hosts[client.client_id]].append(client)
    host_list = [
        local_host(
            prepared,
            algorithm if count == 1 else copy.deepcopy(algorithm),
            initial,
            clients_of_host[index],
            cuda_index=None if devices is None else devices[index],
        )
        for index in range(count)
    ]
    server_class = AsyncFederatedServer if settings.protocol.mode == "async" else FederatedServer
    server = server_class(
        algorithm,
        host_list,
        client_hosts,
        initial,
        independent,
        settings,
        transport=InProcessTransport() if count == 1 else ThreadedTransport(),
    )
    return InProcessRun(server=server, algorithm=algorithm, hosts=host_list)


def state_after_first_probe(prepared) -> object:
    """The method's server state once round 1's probes are absorbed, nothing trained: what
    tells an auto knob's values apart before any candidate trains (PACFL's clustering)."""
    run = in_process_run(prepared)
    try:
        run.server.probe_round(1)
        return run.server.state
    finally:
        run.close()
