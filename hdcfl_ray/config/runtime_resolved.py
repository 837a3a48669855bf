"""What `runtime.*` values written as `auto` (or left to their defaults) resolve to, as
plain functions of the runtime section: the torch threads a host trains with, and
whether a synchronous round's clients train batched. The runtime acts on them, and the
resume and rerun checks compare them (safe_keys.py), so they live with the schema."""

from __future__ import annotations

from typing import Any

from hdcfl_ray.config.schema import RuntimeConfig


def torch_threads_per_host(runtime: RuntimeConfig) -> int:
    """The torch threads a host trains with: `runtime.torch_threads`, or its CPU share
    (at least one). Results are bit-identical only between hosts with the same count
    (the manifest records it)."""
    if runtime.portable:  # one thread: its sums do not depend on the machine's cores (docs/same-results.md)
        return 1
    if runtime.torch_threads != "auto":
        return int(runtime.torch_threads)
    return max(1, int(runtime.num_cpus_per_actor))


def trains_batched(runtime: Any) -> bool:
    """`runtime.batched_training` resolved: `auto` is on exactly when the hosts train on
    CUDA, which they do exactly when they are given a GPU share (runtime/client/device.py)."""
    if runtime.batched_training == "auto":
        return runtime.num_gpus_per_actor > 0
    return bool(runtime.batched_training)
