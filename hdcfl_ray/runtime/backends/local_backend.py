"""The local backend: the server object and the client hosts inside the driver
process, through `local_host`. No Ray is imported. Each host trains with
`runtime.torch_threads` torch threads, like one Ray host, and there are as many
hosts as the run's CPUs hold (`runtime.num_cpus`, or every core, divided by
the threads per host), each on a thread of its own; on CUDA, one host per visible
GPU or per share of one (placement.local_host_devices)."""

from __future__ import annotations

from typing import Any, Callable

from hdcfl_ray.runtime.backends.choice import Backend, local_cpus


class LocalBackend:
    """The server object and its client hosts in this process."""

    name: Backend = "local"

    def __init__(self, prepared: Any) -> None:
        from hdcfl_ray.runtime.backends.local_host import in_process_run  # on use: it loads torch and the methods

        from hdcfl_ray.runtime.backends.placement import local_host_devices

        scenario = prepared.scenario
        # Hosts of one torch thread each (runtime.torch_threads), side by side, as Ray
        # hosts are: both backends give the same bits, the cores are used without an
        # OpenMP barrier between them, and a busy machine slows the run down in
        # proportion (docs/benchmarks.md, "A run beside ...").
        self.threads = local_cpus(scenario.runtime)
        self.host_runtime = scenario.runtime
        devices = local_host_devices(scenario.runtime, prepared.partition.num_clients)
        self.run = in_process_run(
            type(prepared)(scenario=scenario, dataset=prepared.dataset, partition=prepared.partition, privacy=prepared.privacy),
            hosts=len(devices),
            devices=devices,
        )
        self.num_hosts = len(self.run.hosts)
        self.client_hosts = dict(self.run.server.client_hosts)

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.run.server, method)(*args)

    put: Callable[[Any], Any] | None = None  # a checkpoint's values stay plain in this process

    def fetch(self, ref: Any) -> Any:
        """A host thread's result (what a checkpoint of a threaded run holds refs to)."""
        return self.run.server.transport.get(ref)

    def host_names(self) -> list[str]:
        return ["in-process"] if self.num_hosts == 1 else [f"in-process-{index}" for index in range(self.num_hosts)]

    def host_nodes(self) -> list[str | None]:
        return [None] * self.num_hosts

    def host_hardware(self) -> list[dict[str, Any]]:
        return [host.hardware() for host in self.run.hosts]

    def describe(self) -> dict[str, Any]:
        from hdcfl_ray.config.runtime_resolved import torch_threads_per_host
        from hdcfl_ray.runtime.backends.host_gpus import host_gpu_ids

        threads = torch_threads_per_host(self.host_runtime)
        # the GPUs the hosts train on (a Ray run records its cluster's)
        gpus = {gpu for host in self.run.hosts for gpu in host_gpu_ids(str(host.device), None)}
        return {
            "backend": "local",
            "address": "in-process",
            "nodes": 1,
            "cpus": float(self.threads),
            "gpus": float(len(gpus)),
            "torch_threads_per_host": threads,
        }

    def close(self) -> None:
        if self.run is not None:
            self.run.close()
        self.run = None  # type: ignore[assignment]
