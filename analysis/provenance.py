"""Where a table's numbers come from: the commit, the CPU or GPU and the torch and
Ray versions of the runs behind it, read from each run's manifest. CPUs of other
vendors round some float operations differently, so a number is only reproducible
bit for bit on the kind of machine it names."""

from __future__ import annotations

from collections import Counter
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
    }


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
    return f"Made from {len(rows)} run{'' if len(rows) == 1 else 's'}: " + "; ".join(parts) + "."
