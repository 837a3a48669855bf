"""Where a table's numbers come from: the commit, the CPU or GPU and the torch and
Ray versions of the runs behind it, and the arithmetic they computed with, read from
each run's manifest. In the default mode the math libraries pick their kernels by
the CPU, so a number is only reproducible bit for bit on the kind of machine it
names, and two runs of one seed made on different machines differ by their
rounding as well as by method; portable runs (`runtime.portable`) compute the same
bits on every machine (docs/same-results.md)."""

from __future__ import annotations

from collections import Counter
from itertools import combinations
from typing import Any, Iterable, Mapping

UNRECORDED = "unrecorded"


def run_provenance(manifest: Mapping[str, Any]) -> dict[str, str]:
    hardware = manifest.get("hardware") or {}
    packages = manifest.get("packages") or {}
    revision = manifest.get("git_revision")
    commit = str(revision)[:10] if revision else UNRECORDED
    if manifest.get("git_dirty"):
        commit += " (with uncommitted changes)"
    hosts = [host for host in manifest.get("client_host_hardware") or [] if isinstance(host, dict)]
    # a host on CUDA records its device as "cuda:N" and the GPU it trained on; the driver's
    # own list of GPUs is the fallback (on a cluster the driver's node may have none)
    cuda_hosts = [host for host in hosts if str(host.get("device") or "").startswith("cuda")]
    gpus = sorted({str(host["gpu_name"]) for host in cuda_hosts if host.get("gpu_name")}) or list(hardware.get("gpus") or [])
    device = ", ".join(gpus) if cuda_hosts and gpus else str(hardware.get("cpu_model") or hardware.get("processor") or UNRECORDED)
    return {
        "commit": commit,
        "device": device,
        "torch": str(packages.get("torch") or UNRECORDED),
        "ray": str(packages.get("ray") or UNRECORDED),
        "arithmetic": arithmetic_label(manifest, device),
    }


PORTABLE = "portable"
# the variables that cap an instruction set from outside (a default-mode run that set one
# computed with other kernels than its machine's own)
_CAPS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY",
         "OPENBLAS_CORETYPE", "NPY_DISABLE_CPU_FEATURES", "NPY_ENABLE_CPU_FEATURES")  # fmt: skip


def _machine_label(record: Mapping[str, Any]) -> str:
    """One process's default-mode arithmetic: its CPU, the widest instruction set
    that decides its kernels, and any cap it started with."""
    cpu = record.get("cpu") or {}
    offered = set(cpu.get("instruction_sets") or [])
    widest = next((name for flag, name in (("amx_tile", "AMX"), ("avx512_bf16", "AVX512-BF16"), ("avx512f", "AVX512"),
                                           ("avx2", "AVX2")) if flag in offered), "no AVX2")  # fmt: skip
    caps = sorted(f"{name}={value}" for name, value in (record.get("started_with") or {}).items() if name in _CAPS and value)
    return f"{cpu.get('model') or cpu.get('vendor') or UNRECORDED} [{', '.join([widest, *caps])}]"


def arithmetic_label(manifest: Mapping[str, Any], device: str | None = None) -> str:
    """'portable' when the driver and every host computed with the portable pins, else
    'default: ' and the machines they computed on (several when hosts on other nodes
    did): runs with one label share their rounding. A run from before this record
    names its CPU or GPU only."""
    records = [manifest.get("arithmetic")] + [host.get("arithmetic") for host in manifest.get("client_host_hardware") or [] if isinstance(host, dict)]
    records = [record for record in records if isinstance(record, dict)]
    if not records:
        return f"default: {device or run_provenance(manifest)['device']}"
    if all(record.get("portable") for record in records):
        return _portable_label(records)
    return "default: " + " + ".join(sorted({PORTABLE if record.get("portable") else _machine_label(record) for record in records}))


def _portable_label(records: list[Mapping[str, Any]]) -> str:
    """'portable' for runs pinned as this version pins them; runs pinned otherwise (an
    earlier version's pins: MKL's AVX2 branch, which Intel CPUs alone honour) name the
    pins that differ, so a report never pairs them with today's portable bits. numpy's
    targets are left out: they are named by the numpy a run starts with."""
    from hdcfl_ray.portable.environment import NUMPY_FEATURES, portable_environment

    current = {name: value for name, value in portable_environment().items() if name != NUMPY_FEATURES}
    differing: set[str] = set()
    for record in records:
        pinned = record.get("pinned") or {}
        differing.update(f"{name}={pinned.get(name)}" for name, value in current.items() if name in pinned and pinned[name] != value)
    return f"{PORTABLE} [earlier pins: {', '.join(sorted(differing))}]" if differing else PORTABLE


def _machines(label: str) -> set[str]:
    """The CPUs (or GPUs) a label names, without their instruction sets."""
    return {part.split(" [", 1)[0] for part in label.removeprefix("default: ").split(" + ")}


def same_arithmetic(first: str, second: str) -> bool:
    """Two labels of one arithmetic. A run from before the record names only its CPU,
    and is taken to share the arithmetic of runs on a CPU of that name."""
    if first == second:
        return True
    if PORTABLE in (first, second) or ("[" in first and "[" in second):
        return False
    return _machines(first) == _machines(second)


def pairs_bit_for_bit(first: Mapping[str, str], second: Mapping[str, str]) -> bool:
    """Whether two runs' provenances share their arithmetic, so runs of one seed differ
    by method alone (a provenance without the label is taken to)."""
    if "arithmetic" not in first or "arithmetic" not in second:
        return True
    return same_arithmetic(first["arithmetic"], second["arithmetic"])


def provenance_note(provenances: Iterable[Mapping[str, str]]) -> str:
    """'Made from N runs: commit ... (n), ...; device ...; torch ...; Ray ...' with
    counts wherever the runs differ."""
    rows = list(provenances)
    if not rows:
        return ""
    parts = []
    for key, label in (("commit", "commit"), ("device", "on"), ("torch", "torch"), ("ray", "Ray")):
        counts = Counter(row.get(key, UNRECORDED) for row in rows)
        if len(counts) == 1:
            parts.append(f"{label} {next(iter(counts))}")
        else:
            parts.append(f"{label} " + ", ".join(f"{value} ({count} runs)" for value, count in counts.most_common()))
    note = f"Made from {len(rows)} run{'' if len(rows) == 1 else 's'}: " + "; ".join(parts) + "."
    arithmetic = Counter(row.get("arithmetic") for row in rows if row.get("arithmetic"))
    if set(arithmetic) == {PORTABLE}:
        note += " Portable arithmetic (the same bits on every machine)."
    elif any(not same_arithmetic(first, second) for first, second in combinations(arithmetic, 2)):
        listed = ", ".join(f"{label} ({count} run{'' if count == 1 else 's'})" for label, count in arithmetic.most_common())
        note += (
            f" Made in different arithmetic: {listed}. Runs of different arithmetic (the portable mode against the default "
            f"one, or default-mode runs of different machines) round differently, so their numbers are not bit for bit "
            f"comparable, and a verdict that pairs them is marked {ACROSS_MACHINES}."
        )
    return note


ACROSS_MACHINES = "(arithmetic differs)"


def mark_across_machines(verdict: str, pairs: Iterable[tuple[Mapping[str, str], Mapping[str, str]]]) -> str:
    """`verdict`, marked when any of the seed pairs it rests on pairs runs of different arithmetic."""
    return f"{verdict} {ACROSS_MACHINES}" if any(not pairs_bit_for_bit(first, second) for first, second in pairs) else verdict
