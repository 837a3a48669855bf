"""The local backend's in-process host: one plain `ClientHost` owning every client,
and the run's server (synchronous or asynchronous) reaching it by direct calls
through `InProcessTransport`, all inside this process, with no Ray.

`in_process_run` builds a run's server and host: the local backend
(`local_backend.LocalBackend`, what `runtime.backend: local` and most laptop runs
use) runs every round through it, and method tests run rounds through it
directly. `local_host` builds the host alone, for work that needs clients but no
server: `hdcfl-ray ablate` replays saved refreshes through it, and
`hdcfl-ray diagnose donor-swap` scores encoders through it (one per Ray task when
spread over workers).
"""

from __future__ import annotations

from dataclasses import dataclass

from hdcfl_ray.config.methods import build_algorithm
from hdcfl_ray.contract import Method, ModelParams
from hdcfl_ray.runtime.client.client_host import ClientHost
from hdcfl_ray.runtime.initial_model import independent_initialisations, initial_parameters
from hdcfl_ray.runtime.server.async_server import AsyncFederatedServer
from hdcfl_ray.runtime.server.round_tail import RoundReport
from hdcfl_ray.runtime.server.settings import build_server_settings
from hdcfl_ray.runtime.server.sync_server import FederatedServer
from hdcfl_ray.runtime.server.transport import InProcessTransport


@dataclass
class InProcessRun:
    """A run's server and its one host; the local backend calls the server's methods,
    tests step through rounds with `run_round` and `run_all`."""

    server: FederatedServer
    host: ClientHost
    algorithm: Method

    def run_round(self, round_index: int) -> RoundReport:
        return self.server.run_round(round_index)

    def run_all(self) -> list[RoundReport]:
        return [self.run_round(t) for t in range(1, self.server.rounds + 1)]


def local_host(prepared, algorithm: Method | None = None, initial: ModelParams | None = None) -> ClientHost:
    """One plain ClientHost owning every client of a `driver.PreparedRun` (built with
    the run's method and initial weights unless given)."""
    scenario, dataset = prepared.scenario, prepared.dataset
    return ClientHost(
        scenario,
        algorithm or build_algorithm(scenario),
        dataset.train_images,
        dataset.train_labels,
        dataset.test_images,
        dataset.test_labels,
        list(prepared.partition.clients),
        initial or initial_parameters(scenario, dataset),
        dataset.num_classes,
    )


def in_process_run(prepared, algorithm: Method | None = None) -> InProcessRun:
    """The server of a `driver.PreparedRun` (asynchronous if its protocol says so)
    and its one host, ready for round 1."""
    scenario = prepared.scenario
    dataset = prepared.dataset
    algorithm = algorithm or build_algorithm(scenario)
    initial = initial_parameters(scenario, dataset)
    independent = independent_initialisations(scenario, dataset, algorithm.independent_inits)
    host = local_host(prepared, algorithm, initial)
    settings = build_server_settings(scenario, prepared.partition)
    server_class = AsyncFederatedServer if settings.protocol.mode == "async" else FederatedServer
    server = server_class(
        algorithm,
        [host],
        {client_id: 0 for client_id in range(settings.num_clients)},
        initial,
        independent,
        settings,
        transport=InProcessTransport(),
    )
    return InProcessRun(server=server, host=host, algorithm=algorithm)
