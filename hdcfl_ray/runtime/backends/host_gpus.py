"""The GPUs each client host computes on, as the manifest's `runtime.hosts` records
them, alike for both backends: the host's device (`cpu`, or `cuda:N` as the host's
process numbers its devices) and the ids of its GPUs as the machine numbers them: the
ids Ray granted a Ray host, and for a local host its device's entry in
`CUDA_VISIBLE_DEVICES` (its index where that is unset)."""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence


def visible_gpu_id(index: int, environ: Mapping[str, str] = os.environ) -> str:
    """The machine's id of this process's CUDA device `index`."""
    visible = [entry.strip() for entry in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if entry.strip()]
    return visible[index] if index < len(visible) else str(index)


def host_gpu_ids(device: str, granted: Sequence[str] | None, environ: Mapping[str, str] = os.environ) -> list[str]:
    """A host's GPU ids: Ray's grant where there was one (a Ray host), else the id of its
    CUDA device (a local host; none on the CPU)."""
    if granted is not None:
        return [str(gpu) for gpu in granted]
    if not device.startswith("cuda"):
        return []
    _, _, index = device.partition(":")
    return [visible_gpu_id(int(index or 0), environ)]


def host_gpus(hardware: Sequence[Mapping[str, Any]], environ: Mapping[str, str] = os.environ) -> list[dict[str, Any]]:
    """Per host, in host order, from its `client_host_hardware` record: its device and GPU ids."""
    return [
        {"host": host, "device": record["device"], "gpu_ids": host_gpu_ids(record["device"], record.get("granted_gpu_ids"), environ)}
        for host, record in enumerate(hardware)
    ]
