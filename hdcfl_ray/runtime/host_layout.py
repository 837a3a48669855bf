"""Which clients share a client host: a run's host layout, as its manifest records it
and as a resume checks it.

With batched training a round's participants on one host train as one vmap'd model
(runtime/client/batched_training.py), and a client's bits depend on which other
clients it was batched with: the layout is part of what a batched run computes. Which
hosts hold which clients follows from the number of hosts alone (contiguous,
balanced blocks: placement.assign_clients), and that number from the runtime keys and
the machine (its cores, a cluster's CPUs and GPUs). So a resume compares the layout
it would start with the one the run recorded, whatever changed it: a `--set` key, or
another machine. A batched run whose layout would change is refused unless the user
asks for the change; then the manifest records it (`host_layout_changes`) and reports
mark the run. An unbatched run trains every client alone, so its layout changes
nothing and is only recorded.
"""

from __future__ import annotations

from typing import Any, Mapping

from hdcfl_ray.config.schema import RuntimeConfig
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.id_ranges import id_ranges, ranges_text

LAYOUT_RECORD = "host_layout"
LAYOUT_CHANGES = "host_layout_changes"
# the runtime keys that decide how many hosts there are
LAYOUT_KEYS = (
    "runtime.backend",
    "runtime.address",
    "runtime.num_cpus",
    "runtime.clients_per_actor",
    "runtime.max_actors",
    "runtime.num_cpus_per_actor",
    "runtime.num_gpus_per_actor",
    "runtime.torch_threads",
)
ALLOW_OPTION = "--allow-layout-change"


def host_blocks(client_hosts: Mapping[int, int]) -> list[list[list[int]]]:
    """Per host (in host order), the clients it holds as [first, last] ranges: a
    compact record even for a federation of 100,000 clients."""
    clients_of: dict[int, list[int]] = {}
    for client_id, host in client_hosts.items():
        clients_of.setdefault(host, []).append(client_id)
    return [id_ranges(clients_of[host]) for host in sorted(clients_of)]


def layout_record(client_hosts: Mapping[int, int], batched: bool) -> dict[str, Any]:
    """What the manifest keeps of a run's layout."""
    blocks = host_blocks(client_hosts)
    return {"hosts": len(blocks), "clients": blocks, "batched_training": bool(batched)}


def describe(record: Mapping[str, Any]) -> str:
    """'2 hosts: clients 0-9, 10-19' (long layouts shortened)."""
    blocks = [ranges_text(ranges) for ranges in record["clients"]]
    shown = "; ".join(blocks[:4]) + (f"; ... ({len(blocks) - 4} more)" if len(blocks) > 4 else "")
    return f"{record['hosts']} host{'' if record['hosts'] == 1 else 's'}: clients {shown}"


def _layout_keys_changed(before: RuntimeConfig, after: RuntimeConfig) -> list[str]:
    changed = []
    for key in LAYOUT_KEYS:
        name = key.split(".", 1)[1]
        old, new = getattr(before, name), getattr(after, name)
        if old != new:
            changed.append(f"{key}: {old!r} -> {new!r}")
    return changed


def check_resumed_layout(
    run_dir: Any,
    manifest: Mapping[str, Any] | None,
    planned: Mapping[str, Any],
    started_with: RuntimeConfig | None,
    now: RuntimeConfig,
    resumed_at_round: int,
    allow_change: bool,
) -> dict[str, Any] | None:
    """None when the resumed run keeps its layout (or changes one that does not change
    its bits, or recorded none); the change to record when the user allowed it;
    otherwise ScenarioError naming what moved it and the two ways on."""
    recorded = (manifest or {}).get(LAYOUT_RECORD)
    if not isinstance(recorded, dict) or recorded.get("clients") == planned["clients"]:
        return None
    if not (recorded.get("batched_training") or planned["batched_training"]):
        return None  # every client trains alone: which host holds it changes nothing
    change = {"resumed_at_round": int(resumed_at_round), "before": dict(recorded), "after": dict(planned)}
    if allow_change:
        return change
    keys = _layout_keys_changed(started_with, now) if started_with is not None else []
    cause = (
        "the keys that changed it: " + ", ".join(keys)
        if keys
        else "no runtime key changed it: this machine (or cluster) offers another number of CPUs or GPUs than the one it started on"
    )
    raise ScenarioError(
        f"--resume {run_dir}: this run trains each round's clients batched per host, and resuming would put them on other "
        f"hosts (started with {describe(recorded)}; now {describe(planned)}), so clients would train in other batches from "
        f"round {resumed_at_round} on and its results would change; {cause}. Resume with the layout it started with (undo "
        f"those --set keys, or give runtime.num_cpus / runtime.max_actors the values that rebuild it), or pass "
        f"{ALLOW_OPTION} to go on with the new layout: the manifest then records the change ({LAYOUT_CHANGES}) and "
        "reports mark the run."
    )
