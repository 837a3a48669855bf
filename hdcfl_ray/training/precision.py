"""Mixed precision for local training and scoring (`runtime.precision`).

Weights stay float32 on the host (the flat vectors that travel and the server's
aggregation are float32/float64 as always); only the forward passes inside a
hook run under `torch.autocast`, so convolutions and matrix products use
bfloat16 or float16 while losses, softmax and the optimizer's updates stay
float32. float16's narrow range needs loss scaling (`LossScaler`); bfloat16 has
float32's range and needs none.

`auto` picks bfloat16 where it was measured faster than float32 (a CPU with AMX
tiles, an AMD CPU with AVX512-BF16, as far as oneDNN's instruction-set cap in the
process's environment lets oneDNN use them) and float32 elsewhere, CUDA GPUs included: on
an H200 this project's models at its batch sizes trained no faster in bfloat16
(ResNet-18 1.01x float32's samples/s, the small CNN 0.74x). The
default is float32: results then stay bit-stable across versions; a
mixed-precision run is reproducible too (same hardware, same thread count), but
its numbers are its own.
"""

from __future__ import annotations

import contextlib
import os
from typing import Collection, Iterator, Literal, Mapping

import torch

Precision = Literal["fp32", "bf16", "fp16"]
RequestedPrecision = Literal["fp32", "bf16", "fp16", "auto"]
# what oneDNN (torch's CPU convolutions and matrix products) computes bfloat16 with,
# best first: AMX tiles, AVX512-BF16 instructions, or float32 arithmetic with
# conversions around it (emulated: many times slower than plain float32)
Bf16Arithmetic = Literal["amx", "avx512_bf16", "emulated"]
_BF16_RANK: tuple[Bf16Arithmetic, ...] = ("emulated", "avx512_bf16", "amx")

# oneDNN reads its instruction-set cap from ONEDNN_MAX_CPU_ISA, else from its older name,
# once per process, when it first computes
ONEDNN_CAP_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
# each cap oneDNN knows (upper case; the variable is read case-insensitively) and the
# best bfloat16 arithmetic it leaves oneDNN. The ISAs are partially ordered: AVX2_VNNI_2
# converts to and from bfloat16 but has no bfloat16 products, so it counts as emulated;
# AVX10_2 and AVX10_2_ACE sit above AVX10_1_512 but not above its AMX levels. ALL and
# DEFAULT cap nothing, and oneDNN ignores a value it does not know: neither is listed.
_CAP_BF16: dict[str, Bf16Arithmetic] = {
    **dict.fromkeys(("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"), "emulated"),
    **dict.fromkeys(("AVX512_CORE_BF16", "AVX10_1_512", "AVX512_CORE_FP16", "AVX10_2", "AVX10_2_512", "AVX10_2_ACE"), "avx512_bf16"),
    **dict.fromkeys(
        ("AVX10_1_512_AMX", "AVX512_CORE_AMX", "AVX10_1_512_AMX_FP16", "AVX512_CORE_AMX_FP16", "AVX10_2_AMX_2", "AVX10_2_512_AMX_2"), "amx"
    ),
}

_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}


def cpu_vendor() -> str:
    """The CPU's vendor string (GenuineIntel, AuthenticAMD, ...), or '' where unknown."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            return next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("vendor_id")), "")
    except OSError:
        return ""


def onednn_cap(environment: Mapping[str, str]) -> tuple[str, str] | None:
    """(variable, value as set) of the instruction-set cap oneDNN takes from a process
    started with `environment`, or None where nothing caps it (no variable set, ALL,
    DEFAULT, or a value oneDNN does not know and so ignores)."""
    for variable in ONEDNN_CAP_VARIABLES:
        value = environment.get(variable, "").strip()
        if value:  # the first one set wins, even with a value that caps nothing
            return (variable, value) if value.upper() in _CAP_BF16 else None
    return None


def bf16_arithmetic(cpu_flags: Collection[str], environment: Mapping[str, str]) -> Bf16Arithmetic:
    """What oneDNN computes bfloat16 with in a process started with `environment` on a
    CPU with `cpu_flags` (/proc/cpuinfo names): the lower of what the CPU offers and
    what the cap lets oneDNN use (a CPU with AMX capped to AVX2 emulates bfloat16)."""
    offered: Bf16Arithmetic = "amx" if "amx_tile" in cpu_flags else "avx512_bf16" if "avx512_bf16" in cpu_flags else "emulated"
    cap = onednn_cap(environment)
    allowed: Bf16Arithmetic = "amx" if cap is None else _CAP_BF16[cap[1].upper()]
    return min(offered, allowed, key=_BF16_RANK.index)


def _cpu_bf16_flags() -> set[str]:
    """The CPU's bfloat16 instruction sets, by torch's own probe (any OS), as /proc/cpuinfo names them."""
    flags: set[str] = set()
    if torch.cpu._is_amx_tile_supported():
        flags.add("amx_tile")
    if torch.cpu._is_avx512_bf16_supported():
        flags.add("avx512_bf16")
    return flags


def native_bf16(device: torch.device) -> bool:
    """Whether `device` trains faster in bfloat16 than in float32, as measured
    (docs/benchmarks.md, "Mixed precision" and "GPU check"): a CPU with AMX tiles; an
    AMD CPU with AVX512-BF16 (an EPYC trained the compute-bound CIFAR-10 workload in
    0.70x float32's time). An Intel CPU with AVX512-BF16 but no AMX trained at 0.88x
    float32's rate, and an H200 trained batches of 32 at 1.01x (ResNet-18) and 0.74x
    (small CNN) float32's rate, so both keep float32. The CPU counts for what oneDNN
    will use of it under the cap in this process's environment (which a host reads
    itself: it is the process oneDNN computes in)."""
    if device.type == "cuda":  # launch-bound at these batch sizes: bfloat16 kernels bought nothing
        return False
    arithmetic = bf16_arithmetic(_cpu_bf16_flags(), os.environ)
    return arithmetic == "amx" or (arithmetic == "avx512_bf16" and cpu_vendor() == "AuthenticAMD")


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
