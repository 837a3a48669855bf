"""Mixed precision for local training and scoring (`runtime.precision`).

Weights stay float32 on the host (the flat vectors that travel and the server's
aggregation are float32/float64 as always); only the forward passes inside a
hook run under `torch.autocast`, so convolutions and matrix products use
bfloat16 or float16 while losses, softmax and the optimizer's updates stay
float32. float16's narrow range needs loss scaling (`LossScaler`); bfloat16 has
float32's range and needs none.

`auto` picks bfloat16 where it was measured faster than float32 (a CPU with AMX
tiles, an AMD CPU with AVX512-BF16) and float32 elsewhere, CUDA GPUs included: on
an H200 this project's models at its batch sizes trained no faster in bfloat16
(ResNet-18 1.01x float32's samples/s, the small CNN 0.74x). The
default is float32: results then stay bit-stable across versions; a
mixed-precision run is reproducible too (same hardware, same thread count), but
its numbers are its own.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Literal

import torch

Precision = Literal["fp32", "bf16", "fp16"]
RequestedPrecision = Literal["fp32", "bf16", "fp16", "auto"]

_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}


def cpu_vendor() -> str:
    """The CPU's vendor string (GenuineIntel, AuthenticAMD, ...), or '' where unknown."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            return next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("vendor_id")), "")
    except OSError:
        return ""


def native_bf16(device: torch.device) -> bool:
    """Whether `device` trains faster in bfloat16 than in float32, as measured
    (docs/benchmarks.md, "Mixed precision" and "GPU check"): a CPU with AMX tiles; an
    AMD CPU with AVX512-BF16 (an EPYC trained the compute-bound CIFAR-10 workload in
    0.70x float32's time). An Intel CPU with AVX512-BF16 but no AMX trained at 0.88x
    float32's rate, and an H200 trained batches of 32 at 1.01x (ResNet-18) and 0.74x
    (small CNN) float32's rate, so both keep float32."""
    if device.type == "cuda":  # launch-bound at these batch sizes: bfloat16 kernels bought nothing
        return False
    if torch.cpu._is_amx_tile_supported():
        return True
    return cpu_vendor() == "AuthenticAMD" and bool(torch.cpu._is_avx512_bf16_supported())


def resolve_precision(requested: RequestedPrecision, device: torch.device) -> Precision:
    if requested == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    return requested


@contextlib.contextmanager
def autocast(precision: Precision, device: torch.device) -> Iterator[None]:
    """Forward passes inside run at `precision` (nothing changes for fp32)."""
    if precision == "fp32":
        yield
        return
    # No weight-cast cache: it keeps a half copy of each weight until the context
    # exits, and one context spans a whole local update (many optimizer steps), so
    # later forward passes would see the weights of the first.
    with torch.autocast(device_type=device.type, dtype=_DTYPES[precision], cache_enabled=False):
        yield


@contextlib.contextmanager
def outside_autocast(device: torch.device) -> Iterator[None]:
    """Backward passes and optimizer steps run with autocast off (as torch advises);
    their kernels follow the dtypes the forward pass chose."""
    if not torch.is_autocast_enabled(device.type):
        yield
        return
    with torch.autocast(device_type=device.type, enabled=False):
        yield


def active_half_precision() -> torch.dtype | None:
    """The half dtype autocast runs at on this thread's device (None when off)."""
    for device_type in ("cuda", "cpu"):
        if torch.is_autocast_enabled(device_type):
            return torch.get_autocast_dtype(device_type)
    return None


class LossScaler:
    """Dynamic loss scaling for float16 (one per local training run).

    The loss is multiplied by `scale` before backward and the gradients divided
    by it after; a step whose gradients overflow is skipped and the scale halved,
    and after `growth_interval` clean steps it doubles."""

    def __init__(self, scale: float = 2.0**12, growth_interval: int = 200) -> None:
        self.scale = scale
        self.growth_interval = growth_interval
        self._clean_steps = 0

    def backward(self, loss: torch.Tensor) -> None:
        (loss * self.scale).backward()

    def unscale_and_check(self, parameters: list[torch.nn.Parameter]) -> bool:
        """Divide the gradients by the scale; True when they are all finite (then step)."""
        grads = [p.grad for p in parameters if p.grad is not None]
        inverse = 1.0 / self.scale
        finite = True
        for grad in grads:
            grad.mul_(inverse)
        if grads:
            finite = bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())
        if finite:
            self._clean_steps += 1
            if self._clean_steps >= self.growth_interval:
                self.scale *= 2.0
                self._clean_steps = 0
        else:
            self.scale /= 2.0
            self._clean_steps = 0
        return finite
