"""Which backend a run gets: Ray actors, or this process (`runtime.backend`).

`ray` is the simulator's runtime: client host actors packed with logical
clients, a server actor, the object store, host replacement after a crash, any
number of nodes. `local` runs the same `FederatedServer` round logic and one
`ClientHost` owning every client inside the driver process (torch uses all the
CPUs it is given through its own threads). Both produce identical metrics for a
scenario and seed when their hosts use the same number of torch threads: the
thread count can change the rounding of convolution sums, and a run amplifies
it. `local` saves Ray's start-up (a few seconds) and an actor
process per host (about half a gigabyte each with torch), which is most of a
short run on a laptop.

`auto` picks `local` when a run cannot gain from Ray: no cluster address, no
Ray already running in this process (a sweep, a test fixture), no GPU shares,
no explicit `clients_per_actor`, and at most `LOCAL_MAX_CPUS` CPUs to fill.
"""

from __future__ import annotations

import os
import sys
from typing import Literal

from hdcfl_ray.config.schema import RuntimeConfig

# One process's torch threads keep up to this many cores busy on the small models
# a laptop run uses; beyond it, separate host actors scale better.
LOCAL_MAX_CPUS = 4

Backend = Literal["ray", "local"]


def choose_backend(runtime: RuntimeConfig) -> Backend:
    if runtime.backend != "auto":
        return runtime.backend
    # Ray is not imported to ask: a process that never imported it has not started it
    # (and a local run stays free of Ray's import cost and memory).
    ray = sys.modules.get("ray")
    if runtime.address is not None or (ray is not None and ray.is_initialized()):
        return "ray"
    if runtime.num_gpus_per_actor > 0 or runtime.clients_per_actor != "auto":
        return "ray"
    return "local" if local_cpus(runtime) <= LOCAL_MAX_CPUS else "ray"


def local_cpus(runtime: RuntimeConfig) -> int:
    return int(runtime.num_cpus or os.cpu_count() or 1)
