"""The portable environment: which instruction-set path each math library computes
with in a portable run, as the environment variables the libraries read when they
load or first compute (so they must be in a process's environment before it starts).

The level is AVX2 with FMA (x86-64-v3), which every x86-64 server CPU of the last
decade offers, Intel and AMD alike. Each library below picked its kernels by the CPU
and moved the bits of a few quickstart rounds when capped from outside on this
project's Intel Xeon (docs/same-results.md has the measurements):

* oneDNN (torch's CPU convolutions) builds its kernels for the best ISA it finds;
* MKL (torch's matrix products) dispatches per CPU and vendor unless its conditional
  numerical reproducibility fixes a code branch. Only its compatible branch is the
  same code on every vendor: MKL honours the instruction-set branches (AVX2, ...)
  on Intel CPUs only and falls back to its own choice elsewhere. STRICT also makes
  its products independent of the thread count; MKL_ENABLE_INSTRUCTIONS is pinned
  too, so a user's value cannot reach what the branch does not cover;
* ATen (torch's element-wise, reduction and normalisation kernels) picks AVX512 or
  AVX2 builds of its vectorised code;
* OpenBLAS (numpy's matrix products, eigen- and singular-value decompositions: the
  server's maths) picks kernels per core type and splits sums by its thread count;
* numpy's own SIMD loops (exp, log) have AVX512 builds that round differently.
"""

from __future__ import annotations

PORTABLE_LEVEL = "AVX2"
# the CPU flags (Linux /proc/cpuinfo names) the portable level needs
REQUIRED_FLAGS = ("avx2", "fma")

_PINS = {
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "DNNL_MAX_CPU_ISA": "AVX2",  # oneDNN's older name for the same cap
    "MKL_CBWR": "COMPATIBLE,STRICT",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "ATEN_CPU_CAPABILITY": "avx2",
    "OPENBLAS_CORETYPE": "Haswell",
    "OPENBLAS_NUM_THREADS": "1",
    # numpy refuses to load with both of its variables set; empty counts as unset
    "NPY_ENABLE_CPU_FEATURES": "",
}
NUMPY_FEATURES = "NPY_DISABLE_CPU_FEATURES"
# every variable that decides a CPU run's instruction sets or thread counts: the manifest
# records the values a process started with, in either mode (a default-mode run with one
# of them set computed with other kernels than the machine's own)
ARITHMETIC_VARIABLES = (
    *_PINS,
    NUMPY_FEATURES,
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
)


def numpy_features_above_level() -> list[str]:
    """The SIMD targets this numpy dispatches to above AVX2 (its AVX512 builds), by
    the names this numpy version gives them (2.x: X86_V4, AVX512_ICL, ...; 1.x:
    AVX512F, AVX512_SKX, ...)."""
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__ as dispatched  # numpy 2
    except ImportError:
        from numpy.core._multiarray_umath import __cpu_dispatch__ as dispatched  # type: ignore[no-redef]
    return [name for name in dispatched if name.startswith(("AVX512", "X86_V4", "AVX10"))]


def portable_environment() -> dict[str, str]:
    """The variables, and their values, every process of a portable run starts with."""
    environment = dict(_PINS)
    above = numpy_features_above_level()
    if above:
        environment[NUMPY_FEATURES] = ",".join(above)  # numpy also splits on commas, which survive a shell's word splitting
    return environment
