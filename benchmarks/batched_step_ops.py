"""The host's side of one batched training step: how many operations the CPU issues per
step (torch's profiler, top-level operations only) and how many of them would make the
host wait for a GPU (benchmarks/host_syncs.py), for N clients trained as one batched
model against one client trained alone (`train_locally`, the unbatched path).

On a GPU the host issues a step's operations while the device runs the previous one;
a step costs max(CPU time, GPU time) when nothing waits, and their sum when something
does. So the counts say how far a GPU can be kept busy: they are the same on any
device, which is why they are measured here, on the CPU.

    python -m benchmarks.batched_step_ops [--clients 10] [--encoder resnet18_cifar|small_cnn] [--out docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any, Callable

from benchmarks._common import append_markdown, machine_description, print_table
from benchmarks._workload import cifar_clients, cifar_model


def _top_level_ops(run: Callable[[], None]) -> int:
    """Operations the host issued at the top level while `run` ran (their own
    sub-operations not counted again)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as profiled:
        run()
    return sum(1 for event in profiled.events() if event.cpu_parent is None and event.name.startswith("aten::"))


def measure(clients: int, encoder: str, images: int, batch: int, whole_update: bool = False) -> list[dict[str, Any]]:
    import torch

    from benchmarks.host_syncs import HostSyncCounter
    from hdcfl_ray.contract import OptimizerConfig
    from hdcfl_ray.runtime.client import batched_training
    from hdcfl_ray.runtime.client.batched_training import TrainRequest, train_together
    from hdcfl_ray.training.local_training import train_locally

    torch.set_num_threads(1)
    sgd = OptimizerConfig(name="sgd", lr=0.05, momentum=0.9, weight_decay=5e-4)
    base = cifar_model(encoder)
    data = cifar_clients(clients, images)
    steps = -(-images // batch)
    requests = [
        TrainRequest(model=copy.deepcopy(base), inputs=x, labels=y, epochs=1, batch_size=batch, optimizer_config=sgd,
                     generator=torch.Generator().manual_seed(client))
        for client, (x, y) in enumerate(data)
    ]  # fmt: skip
    counted: dict[str, Any] = {}
    loop = getattr(batched_training, "run_steps", None)

    def profiled_loop(groups: Any, state: Any, concatenated: Any, loss_log: Any) -> None:
        with HostSyncCounter() as counter:
            counted["ops"] = _top_level_ops(lambda: loop(groups, state, concatenated, loss_log))
        counted["syncs"] = len(counter.syncs)

    if whole_update:  # the whole update (set-up and finish included), for code without a separate step loop
        with HostSyncCounter() as counter:
            counted["ops"] = _top_level_ops(lambda: train_together(requests))
        counted["syncs"] = len(counter.syncs)
    else:
        batched_training.run_steps = profiled_loop  # type: ignore[assignment]
        try:
            train_together(requests)
        finally:
            batched_training.run_steps = loop  # type: ignore[assignment]
    alone_model = copy.deepcopy(base)
    x, y = data[0]
    with HostSyncCounter() as alone_counter:
        alone_ops = _top_level_ops(
            lambda: train_locally(alone_model, x, y, epochs=1, batch_size=batch, optimizer_config=sgd, generator=torch.Generator().manual_seed(0))
        )
    return [
        {"path": f"batched, {clients} clients as one model", "steps": steps, "top-level ops per step": round(counted["ops"] / steps),
         "ops per client-step": round(counted["ops"] / steps / clients, 1), "host waits per step": round(counted["syncs"] / steps, 2)},
        {"path": "one client alone (train_locally)", "steps": steps, "top-level ops per step": round(alone_ops / steps),
         "ops per client-step": round(alone_ops / steps, 1), "host waits per step": round(len(alone_counter.syncs) / steps, 2)},
    ]  # fmt: skip


# the CUDA runtime calls that block the host until the device has caught up
_CUDA_WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy ", "cudaMemcpy")


def device_profile(device: str, clients: int, encoder: str, images: int, batch: int) -> dict[str, Any]:
    """One batched local update of `clients` clients on `device` (after one to warm up):
    the host's top-level operations and waits per step and, on CUDA, the fraction of the
    step loop's wall time the GPU was busy and the blocking CUDA calls per step."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.host_syncs import HostSyncCounter
    from hdcfl_ray.contract import OptimizerConfig
    from hdcfl_ray.runtime.client import batched_training
    from hdcfl_ray.runtime.client.batched_training import TrainRequest, train_together

    sgd = OptimizerConfig(name="sgd", lr=0.05, momentum=0.9, weight_decay=5e-4)
    base = cifar_model(encoder, device)
    data = cifar_clients(clients, images, device=device)
    steps = -(-images // batch)

    def requests() -> list[TrainRequest]:
        return [TrainRequest(model=copy.deepcopy(base), inputs=x, labels=y, epochs=1, batch_size=batch, optimizer_config=sgd,
                             generator=torch.Generator().manual_seed(client)) for client, (x, y) in enumerate(data)]  # fmt: skip

    train_together(requests())  # warm-up: kernels chosen, memory allocated
    on_cuda = torch.device(device).type == "cuda"
    counted: dict[str, Any] = {}
    loop = batched_training.run_steps

    def profiled_loop(groups: Any, state: Any, concatenated: Any, loss_log: Any) -> None:
        activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if on_cuda else [])]
        with HostSyncCounter() as counter, profile(activities=activities) as profiled:
            if on_cuda:
                torch.cuda.synchronize()
            started = time.perf_counter()
            loop(groups, state, concatenated, loss_log)
            if on_cuda:
                torch.cuda.synchronize()
            counted["wall_s"] = time.perf_counter() - started
        events = profiled.events()
        counted["ops"] = sum(1 for event in events if event.cpu_parent is None and event.name.startswith("aten::"))
        counted["syncs"] = len(counter.syncs)
        counted["cuda_waits"] = sum(1 for event in events if event.name.startswith(_CUDA_WAITS) and "Async" not in event.name)
        kernel_us = sum(event.device_time for event in events if getattr(event, "device_type", None) == torch.autograd.DeviceType.CUDA)
        counted["busy"] = kernel_us / 1e6 / counted["wall_s"] if on_cuda and counted["wall_s"] > 0 else None

    batched_training.run_steps = profiled_loop  # type: ignore[assignment]
    try:
        train_together(requests())
    finally:
        batched_training.run_steps = loop  # type: ignore[assignment]
    return {
        "device": device, "clients": clients, "encoder": encoder, "batch": batch, "steps": steps,
        "top_level_ops_per_step": round(counted["ops"] / steps, 1),
        "host_waits_per_step": round(counted["syncs"] / steps, 2),
        "blocking_cuda_calls_per_step": round(counted["cuda_waits"] / steps, 2) if on_cuda else None,
        "gpu_busy_fraction": None if counted["busy"] is None else round(min(1.0, counted["busy"]), 3),
        "step_loop_s": round(counted["wall_s"], 3),
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=10, help="clients trained as one batched model (the paper round: 10)")
    parser.add_argument("--encoder", default="resnet18_cifar", choices=["resnet18_cifar", "small_cnn"])
    parser.add_argument("--images", type=int, default=96, help="training images per client (steps = images / batch)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--whole-update", action="store_true", help="count the whole batched update (set-up included), not its step loop alone")
    parser.add_argument("--out", type=Path, default=None, help="append the table to this markdown file")
    args = parser.parse_args()
    rows = measure(args.clients, args.encoder, args.images, args.batch, args.whole_update)
    print_table(rows)
    if args.out is not None:
        command = "python -m benchmarks.batched_step_ops " + " ".join(sys.argv[1:]).replace(f"--out {args.out}", "").strip()
        append_markdown(args.out, f"Host operations per batched training step ({args.encoder}, batch {args.batch})", command, machine_description(), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
