"""How many client host actors to start and which logical clients each one owns."""

from __future__ import annotations

import math

from hdcfl_ray.config.schema import RuntimeConfig


def count_hosts(runtime: RuntimeConfig, num_clients: int, available_cpus: float, available_gpus: float) -> int:
    """`clients_per_actor: N` gives ceil(K / N) hosts; `auto` gives as many hosts as
    there are actor slots (CPU and GPU shares), never more than there are clients."""
    if isinstance(runtime.clients_per_actor, int):
        hosts = math.ceil(num_clients / runtime.clients_per_actor)
    else:
        slots = max(1, int(available_cpus // runtime.num_cpus_per_actor))
        if runtime.num_gpus_per_actor > 0:
            slots = min(slots, max(1, int(round(available_gpus / runtime.num_gpus_per_actor, 6))))
        hosts = min(num_clients, slots)
    if runtime.max_actors is not None:
        hosts = min(hosts, runtime.max_actors)
    return max(1, hosts)


def assign_clients(num_clients: int, num_hosts: int) -> dict[int, int]:
    """Contiguous, balanced blocks: client -> host index."""
    base, extra = divmod(num_clients, num_hosts)
    assignment: dict[int, int] = {}
    client_id = 0
    for host_index in range(num_hosts):
        for _ in range(base + (1 if host_index < extra else 0)):
            assignment[client_id] = host_index
            client_id += 1
    return assignment


def local_host_count(runtime: RuntimeConfig, num_clients: int) -> int:
    """The local backend's hosts: as many as the run's CPUs hold hosts of
    `torch_threads_per_host` threads each, never more than there are clients."""
    from hdcfl_ray.runtime.backends.choice import local_cpus
    from hdcfl_ray.runtime.client.client_host import torch_threads_per_host

    return max(1, min(num_clients, local_cpus(runtime) // torch_threads_per_host(runtime)))
