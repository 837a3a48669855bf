"""MKL told that it runs on the other vendor's CPU, to imitate from one machine the
part of another vendor's arithmetic that instruction-set caps cannot: MKL dispatches
by vendor (on a CPU it does not take for Intel's it ignores its instruction-set
branches and picks kernels of its own), and asks one function which vendor it is on.
A tiny library preloaded ahead of torch's answers that question the other way.

Measured on an AMD EPYC (Zen 4, AVX-512) with torch 2.14.1 on 2026-12-05: told it
runs on an Intel CPU, MKL there reproduced the default-mode golden file recorded on
an Intel Xeon bit for bit, and with MKL_CBWR=AVX2,STRICT the Intel-made portable file
of the earlier pins; so MKL's vendor dispatch was the whole difference between the
two machines' bits. Needs a C compiler (cc or gcc); tests skip, saying so, without one."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

# the functions MKL asks: 1 when it takes the CPU for an Intel one
_SOURCE = "int mkl_serv_intel_cpu_true(void) {{ return {answer}; }}\nint mkl_serv_intel_cpu(void) {{ return {answer}; }}\n"


def cpu_vendor() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            return next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("vendor_id")), "unknown")
    except OSError:
        return "unknown"


def other_vendor() -> str:
    """The vendor MKL is told it runs on."""
    return "AuthenticAMD (any CPU MKL does not take for Intel's)" if cpu_vendor() == "GenuineIntel" else "GenuineIntel"


def compiler() -> str | None:
    return shutil.which("cc") or shutil.which("gcc")


def other_vendor_library(folder: Path) -> Path:
    """The preloadable library that tells MKL it runs on the other vendor's CPU."""
    tool = compiler()
    assert tool is not None, "no C compiler (cc or gcc)"
    source, library = folder / "mkl_other_vendor.c", folder / "libmkl_other_vendor.so"
    source.write_text(_SOURCE.format(answer=0 if cpu_vendor() == "GenuineIntel" else 1))
    subprocess.run([tool, "-shared", "-fPIC", "-O2", "-o", str(library), str(source)], check=True, capture_output=True)
    return library
