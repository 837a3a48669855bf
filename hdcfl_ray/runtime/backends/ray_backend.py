"""Where a run's server and client hosts live: Ray actors, or this process.

`ray` is the simulator's runtime: client host actors packed with logical
clients, a server actor, the object store, host replacement after a crash, any
number of nodes. `local` runs the same `FederatedServer` round logic and one
`ClientHost` owning every client inside the driver process (torch uses all the
CPUs it is given through its own threads). Both produce identical metrics for a
scenario and seed when their hosts use the same number of torch threads: the
thread count can change the rounding of convolution sums, and a run amplifies
it. `local` saves Ray's start-up (a few seconds) and an actor
process per host (about half a gigabyte each with torch), which is most of a
short run on a laptop.

`auto` picks `local` when a run cannot gain from Ray: no cluster address, no
Ray already running in this process (a sweep, a test fixture), no GPU shares,
no explicit `clients_per_actor`, and at most `LOCAL_MAX_CPUS` CPUs to fill.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Literal

from hdcfl_ray.config.schema import RuntimeConfig

# One process's torch threads keep up to this many cores busy on the small models
# a laptop run uses; beyond it, separate host actors scale better.
LOCAL_MAX_CPUS = 4

Backend = Literal["ray", "local"]


def choose_backend(runtime: RuntimeConfig) -> Backend:
    if runtime.backend != "auto":
        return runtime.backend
    # Ray is not imported to ask: a process that never imported it has not started it
    # (and a local run stays free of Ray's import cost and memory).
    ray = sys.modules.get("ray")
    if runtime.address is not None or (ray is not None and ray.is_initialized()):
        return "ray"
    if runtime.num_gpus_per_actor > 0 or runtime.clients_per_actor != "auto":
        return "ray"
    return "local" if local_cpus(runtime) <= LOCAL_MAX_CPUS else "ray"


def local_cpus(runtime: RuntimeConfig) -> int:
    return int(runtime.num_cpus or os.cpu_count() or 1)


class LocalBackend:
    """The server object and one client host in this process; calls are plain calls."""

    name: Backend = "local"

    def __init__(self, prepared: Any) -> None:
        from hdcfl_ray.runtime.backends.local_host import in_process_run

        scenario = prepared.scenario
        # The one host gets every CPU the run may use as torch threads.
        threads = local_cpus(scenario.runtime)
        scenario = scenario.model_copy(update={"runtime": scenario.runtime.model_copy(update={"num_cpus_per_actor": threads})})
        self.threads = threads
        self.host_runtime = scenario.runtime
        self.run = in_process_run(type(prepared)(scenario=scenario, dataset=prepared.dataset, partition=prepared.partition))
        self.num_hosts = 1
        self.client_hosts = {client.client_id: 0 for client in prepared.partition.clients}

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.run.server, method)(*args)

    fetch: Callable[[Any], Any] | None = None  # checkpoint values are already plain
    put: Callable[[Any], Any] | None = None

    def host_names(self) -> list[str]:
        return ["in-process"]

    def host_nodes(self) -> list[str | None]:
        return [None]

    def describe(self) -> dict[str, Any]:
        from hdcfl_ray.runtime.client.client_host import torch_threads_per_host

        threads = torch_threads_per_host(self.host_runtime)
        return {"backend": "local", "address": "in-process", "nodes": 1, "cpus": float(self.threads), "gpus": 0.0, "torch_threads_per_host": threads}

    def close(self) -> None:
        self.run = None  # type: ignore[assignment]


class RayBackend:
    """Client host actors and a server actor on the Ray cluster `session` is joined to."""

    name: Backend = "ray"

    def __init__(self, prepared: Any, session: Any) -> None:
        import ray

        from hdcfl_ray.config.methods import build_algorithm
        from hdcfl_ray.runtime.backends.actors import start_hosts, start_server, wait_until_ready
        from hdcfl_ray.runtime.initial_model import independent_initialisations, initial_parameters
        from hdcfl_ray.runtime.backends.placement import assign_clients, count_hosts
        from hdcfl_ray.runtime.server.sync_server import build_server_settings

        scenario = prepared.scenario
        self.host_runtime = scenario.runtime
        self.session = session
        num_clients = prepared.partition.num_clients
        self.num_hosts = count_hosts(scenario.runtime, num_clients, session.cpus, session.gpus)
        session.check_capacity(self.num_hosts)
        self.client_hosts = assign_clients(num_clients, self.num_hosts)
        algorithm = build_algorithm(scenario)
        initial = initial_parameters(scenario, prepared.dataset)
        independent = independent_initialisations(scenario, prepared.dataset, algorithm.independent_inits)
        self.hosts, self._host_spec = start_hosts(prepared, self.client_hosts, self.num_hosts, algorithm, initial)
        self.server = start_server(
            build_server_settings(scenario, prepared.partition), algorithm, self.hosts, self.client_hosts, initial, independent,
            self._host_spec, scenario.runtime.max_restarts,
        )
        wait_until_ready(self.hosts, self.server)
        self.fetch = ray.get
        self.put = ray.put

    def call(self, method: str, *args: Any) -> Any:
        import ray

        return ray.get(getattr(self.server, method).remote(*args))

    def host_names(self) -> list[str]:
        import ray

        return ray.get([host.actor_name.remote() for host in self.hosts])

    def host_nodes(self) -> list[str | None]:
        import ray

        return ray.get([host.node_id.remote() for host in self.hosts])

    def describe(self) -> dict[str, Any]:
        from hdcfl_ray.runtime.client.client_host import torch_threads_per_host

        return {"backend": "ray", **self.session.describe(), "torch_threads_per_host": torch_threads_per_host(self.host_runtime)}

    def close(self) -> None:
        import ray

        try:
            replacements = ray.get(self.server.host_handles.remote())
        except Exception:  # the server is gone: kill what we know of
            replacements = []
        for actor in [self.server, *replacements, *self.hosts]:
            ray.kill(actor)
        self._host_spec = None
