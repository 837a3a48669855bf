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


def local_host_count(runtime: RuntimeConfig, num_clients: int, cuda_devices: int | None = None) -> int:
    """The local backend's hosts (local_host_devices says on which device each trains)."""
    return len(local_host_devices(runtime, num_clients, cuda_devices))


def local_host_devices(runtime: RuntimeConfig, num_clients: int, cuda_devices: int | None = None) -> list[int | None]:
    """Per host of the local backend, the CUDA device it trains on (None: the CPU).

    On the CPU: as many hosts as the run's CPUs hold hosts of `torch_threads_per_host`
    threads each. On CUDA (a GPU share asked for): the layout follows the devices, not
    the cores: one host per visible GPU, or per share of it the user asked for (0.25:
    four), each holding that share's clients, so a round's participants on a device
    train as one batched model. Never more hosts than clients, nor than
    `runtime.max_actors`. `cuda_devices` is the visible GPUs (default: torch's count)."""
    from hdcfl_ray.runtime.backends.choice import local_cpus
    from hdcfl_ray.config.runtime_resolved import torch_threads_per_host

    share = runtime.num_gpus_per_actor
    if share <= 0:
        hosts = local_cpus(runtime) // torch_threads_per_host(runtime)
        devices: list[int | None] = [None] * max(1, min(num_clients, hosts))
    else:
        if cuda_devices is None:
            import torch

            cuda_devices = torch.cuda.device_count()
        per_device = max(1, int(round(1.0 / share, 6))) if share < 1 else 1
        spacing = max(1, int(share)) if share >= 1 else 1  # a host uses one GPU; a share above 1 reserves more
        usable = list(range(0, max(1, cuda_devices), spacing))  # no GPU: one host, whose device check says why
        devices = [device for device in usable for _ in range(per_device)][: max(1, num_clients)]
    if runtime.max_actors is not None:
        devices = devices[: runtime.max_actors]
    return devices
