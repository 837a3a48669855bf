"""Which device a client host computes on, and the CUDA settings it computes with.

A host uses CUDA exactly when it was given a GPU: inside Ray, when Ray granted
its actor (or task) GPU ids; outside Ray (the local backend, `ablate`), when
the scenario asks for one (`runtime.num_gpus_per_actor > 0`). Whether torch
could see a GPU is not the question: a host that asked for none trains on the
CPU even on a GPU node, so Ray's accounting and the manifest stay true. A host
that was given a GPU it cannot use (no driver, or a driver older than the CUDA
the torch wheel was built for) stops with the reason instead of training on the
CPU with one thread.

Before the first CUDA operation a CUDA host fixes what decides its bits:
deterministic cuDNN and cuBLAS (`runtime.cuda_deterministic`, on by default)
and TF32 (`runtime.cuda_tf32`, off by default). Determinism is process-wide in
torch, so every host of a process shares it (the local backend's hosts agree,
as they share one scenario). Ops torch has no deterministic CUDA kernel for
warn instead of failing (e.g. the backward of adaptive average pooling); the
README's GPU section lists what that leaves. torch's deterministic mode would also
fill every newly allocated tensor with NaN (`fill_uninitialized_memory`), a kernel
launch per allocation (529 instead of 75 per batched ResNet-18 step) that changes
no result: nothing here reads memory before writing it, and
tests/test_deterministic_fill.py shows the same bits with the fill on and off.
The fill is off in the project's deterministic mode.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch

from hdcfl_ray.config.schema import RuntimeConfig
from hdcfl_ray.errors import ScenarioError

# cuBLAS reproducibility needs a fixed workspace, chosen before its first handle.
CUBLAS_WORKSPACE = ":4096:8"


def granted_gpu_ids() -> list[str] | None:
    """The GPU ids Ray granted the calling actor or task, or None outside a Ray worker
    (the driver process, or no Ray at all)."""
    ray = sys.modules.get("ray")  # never imported here: a local run stays free of Ray
    if ray is None or not ray.is_initialized():
        return None
    worker = ray._private.worker.global_worker
    if worker.mode != ray.WORKER_MODE:
        return None
    return [str(gpu) for gpu in ray.get_gpu_ids()]


def wants_cuda(runtime: RuntimeConfig, granted: list[str] | None) -> bool:
    """A GPU was given: granted ids inside Ray, the scenario's share outside it."""
    if granted is not None:
        return len(granted) > 0
    return runtime.num_gpus_per_actor > 0


def _cuda_failure() -> str:
    """Why torch cannot use CUDA here, in torch's words where it has them."""
    try:
        torch.cuda.init()
    except Exception as error:  # torch's message names the missing or too old driver
        return str(error).strip().splitlines()[0]
    return "torch.cuda.is_available() is False"


def choose_device(
    runtime: RuntimeConfig, granted: list[str] | None = None, cuda_available: Callable[[], bool] | None = None, index: int = 0
) -> torch.device:
    """The device of a host with `runtime`'s settings and the GPU ids Ray granted it
    (None: not a Ray worker); outside Ray a CUDA host trains on GPU `index` (the local
    backend's hosts, one or more per visible GPU)."""
    if not wants_cuda(runtime, granted):
        return torch.device("cpu")
    if not (cuda_available or torch.cuda.is_available)():
        given = f"Ray granted this host GPU {', '.join(granted)}" if granted else "the scenario asks for a GPU"
        raise ScenarioError(
            f"runtime.num_gpus_per_actor: {runtime.num_gpus_per_actor:g}: {given}, but torch cannot use CUDA: "
            f"{_cuda_failure()}. This torch was built for CUDA {torch.version.cuda or 'none (a CPU-only wheel)'}; "
            "the NVIDIA driver must support at least that version (nvidia-smi prints the highest it supports). "
            "Install a torch wheel that matches the driver, or set runtime.num_gpus_per_actor: 0 to train on CPU"
        )
    # Ray makes the granted GPUs the only visible ones, so the first is this host's.
    return torch.device("cuda", 0 if granted else index)


def configure_cuda(runtime: RuntimeConfig, device: torch.device) -> None:
    """The reproducibility and memory settings of a CUDA host, before its first CUDA
    operation (nothing for a CPU host: CPU arithmetic is left exactly as it was)."""
    if device.type != "cuda":
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.backends.cuda.matmul.allow_tf32 = runtime.cuda_tf32
    torch.backends.cudnn.allow_tf32 = runtime.cuda_tf32
    torch.backends.cudnn.deterministic = runtime.cuda_deterministic
    torch.backends.cudnn.benchmark = not runtime.cuda_deterministic
    torch.use_deterministic_algorithms(runtime.cuda_deterministic, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = False  # no kernel per allocation (module docstring)
    share = runtime.num_gpus_per_actor
    if runtime.cuda_memory_cap and 0 < share < 1:
        torch.cuda.set_per_process_memory_fraction(share, device)


@dataclass(frozen=True)
class DeviceFacts:
    """What the manifest records about a host's device."""

    device: str
    gpu_name: str | None
    cuda_version: str | None
    granted_gpu_ids: list[str] | None
    cuda_tf32: bool | None
    cuda_deterministic: bool | None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def device_facts(runtime: RuntimeConfig, device: torch.device, granted: list[str] | None) -> DeviceFacts:
    on_cuda = device.type == "cuda"
    return DeviceFacts(
        device=str(device),
        gpu_name=torch.cuda.get_device_name(device) if on_cuda else None,
        cuda_version=torch.version.cuda if on_cuda else None,
        granted_gpu_ids=granted,
        cuda_tf32=runtime.cuda_tf32 if on_cuda else None,
        cuda_deterministic=runtime.cuda_deterministic if on_cuda else None,
    )
