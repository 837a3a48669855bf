"""What a process computes on and with: the instruction sets its CPU offers, the
arithmetic variables it started with, and the paths its libraries took. The driver
records this in the manifest (`arithmetic`) and every client host beside its device
(`client_host_hardware`), in either mode, so a report can tell runs of different
machines apart."""

from __future__ import annotations

import os
import platform
from typing import Any

from hdcfl_ray.portable.environment import ARITHMETIC_VARIABLES, REQUIRED_FLAGS

# the instruction sets that decide which kernels the libraries pick, as /proc/cpuinfo names them
RECORDED_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16",
    "amx_tile", "amx_bf16",
)  # fmt: skip
# MKL's conditional numerical reproducibility: mkl_cbwr_get(MKL_CBWR_ALL) -> branch | STRICT
_MKL_BRANCHES = {1: "off", 2: "auto", 3: "COMPATIBLE", 4: "SSE2", 6: "SSSE3", 7: "SSE4_1", 8: "SSE4_2", 9: "AVX", 10: "AVX2", 12: "AVX512", 14: "AVX512_E1"}
_MKL_STRICT = 0x10000


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip().lower()] = value.strip()
    except OSError:
        pass
    return fields


def cpu_facts() -> dict[str, Any]:
    """The CPU: architecture, vendor, model and the recorded instruction sets it offers."""
    info = _cpuinfo()
    if info.get("flags"):
        flags = set(info["flags"].split())
    else:  # no /proc/cpuinfo (macOS, Windows): torch's own CPU probe, for the flags it knows
        flags = set()
        try:
            import torch.cpu

            probes = {"avx2": "_is_avx2_supported", "avx512f": "_is_avx512_supported", "avx512_bf16": "_is_avx512_bf16_supported", "amx_tile": "_is_amx_tile_supported"}
            flags = {flag for flag, probe in probes.items() if getattr(torch.cpu, probe, lambda: False)()}
        except ImportError:
            pass
    return {
        "architecture": platform.machine(),
        "vendor": info.get("vendor_id") or platform.processor() or None,
        "model": info.get("model name") or None,
        "instruction_sets": [flag for flag in RECORDED_FLAGS if flag in flags],
    }


def missing_for_portable(cpu: dict[str, Any]) -> list[str]:
    """What the portable level needs that this CPU lacks ([] when it can run it)."""
    if cpu["architecture"] not in ("x86_64", "AMD64"):
        return [f"an x86-64 CPU (this one is {cpu['architecture']})"]
    return [flag.upper() for flag in REQUIRED_FLAGS if flag not in cpu["instruction_sets"]]


def initial_environment() -> dict[str, str]:
    """The environment this process started with. On Linux /proc/self/environ, which
    later changes of os.environ do not touch: a library that read a variable when it
    loaded saw this value. Elsewhere os.environ, the best there is."""
    try:
        with open("/proc/self/environ", "rb") as handle:
            entries = handle.read().split(b"\0")
    except OSError:
        return dict(os.environ)
    environment = {}
    for entry in entries:
        key, separator, value = entry.partition(b"=")
        if separator:
            environment[key.decode(errors="replace")] = value.decode(errors="replace")
    return environment


def mkl_reproducibility() -> str | None:
    """MKL's reproducibility branch in this process (e.g. 'AVX2,STRICT', 'off'), or None
    where torch's MKL cannot be asked (another build, another system)."""
    import ctypes

    try:
        import torch

        library = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        value = int(library.mkl_serv_cbwr_get(ctypes.c_int(-1)))
    except (OSError, AttributeError, ImportError):
        return None
    if value < 0:
        return None
    branch = _MKL_BRANCHES.get(value & ~_MKL_STRICT, str(value & ~_MKL_STRICT))
    return branch + (",STRICT" if value & _MKL_STRICT else "")


def openblas_facts() -> dict[str, Any] | None:
    """numpy's OpenBLAS: the core type its kernels are for and its threads (None when
    threadpoolctl is missing or numpy uses another BLAS)."""
    try:
        import numpy  # noqa: F401  (loads the BLAS threadpoolctl reads)
        import threadpoolctl
    except ImportError:
        return None
    for library in threadpoolctl.threadpool_info():
        if library.get("internal_api") == "openblas":
            return {"core_type": library.get("architecture"), "threads": library.get("num_threads")}
    return None


def numpy_simd() -> list[str]:
    """The SIMD targets numpy's own loops dispatch to in this process."""
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__ as dispatched, __cpu_features__ as features
    except ImportError:
        from numpy.core._multiarray_umath import __cpu_dispatch__ as dispatched, __cpu_features__ as features  # type: ignore[no-redef]
    return [name for name in dispatched if features.get(name)]


def libraries_in_effect() -> dict[str, Any]:
    """The instruction-set paths this process's libraries compute with. Asking ATen
    fixes its choice for the life of the process, so this runs after the
    environment is settled (oneDNN cannot be asked: its cap is the variable the
    process started with)."""
    import torch

    return {
        "aten": torch.backends.cpu.get_cpu_capability(),
        "mkl": mkl_reproducibility(),
        "openblas": openblas_facts(),
        "numpy_simd": numpy_simd(),
    }


def arithmetic_facts(portable: bool) -> dict[str, Any]:
    """This process's record: the mode, the CPU, the arithmetic variables it started
    with and the libraries' paths."""
    from hdcfl_ray.portable.environment import portable_environment

    started_with = initial_environment()
    return {
        "portable": portable,
        "pinned": portable_environment() if portable else None,
        "cpu": cpu_facts(),
        "started_with": {name: started_with[name] for name in ARITHMETIC_VARIABLES if name in started_with},
        "in_effect": libraries_in_effect(),
    }
