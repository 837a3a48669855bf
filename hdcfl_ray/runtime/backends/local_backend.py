"""The local backend: the server object and one client host owning every client,
inside the driver process, through `local_host`. No Ray is imported; the host
trains with `runtime.torch_threads` torch threads, like one Ray host."""

from __future__ import annotations

from typing import Any, Callable

from hdcfl_ray.runtime.backends.choice import Backend, local_cpus


class LocalBackend:
    """The server object and one client host in this process; calls are plain calls."""

    name: Backend = "local"

    def __init__(self, prepared: Any) -> None:
        from hdcfl_ray.runtime.backends.local_host import in_process_run  # on use: it loads torch and the methods

        scenario = prepared.scenario
        # The one host trains with a host's thread count (runtime.torch_threads), as a Ray
        # host does, so both backends give the same bits and a busy machine slows it
        # down in proportion (docs/benchmarks.md, "A run beside ...").
        self.threads = local_cpus(scenario.runtime)
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

    def host_hardware(self) -> list[dict[str, Any]]:
        return [self.run.host.hardware()]

    def describe(self) -> dict[str, Any]:
        from hdcfl_ray.runtime.client.client_host import torch_threads_per_host

        threads = torch_threads_per_host(self.host_runtime)
        return {"backend": "local", "address": "in-process", "nodes": 1, "cpus": float(self.threads), "gpus": 0.0, "torch_threads_per_host": threads}

    def close(self) -> None:
        self.run = None  # type: ignore[assignment]
