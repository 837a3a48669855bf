"""Which clients trained together in a finished run: per round and client host, the
participants it ran and how many of them trained as one batched model, read from the
run's updates.parquet (round, client_id, host, trained_together) and rounds.parquet
(wall_time_s, aggregate_s). The GPU check records and prints it for every layout it runs.

Standard library at import (benchmarks/gpu_check.py imports it before any install);
pyarrow is imported when a run is read.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any


def run_layout(run_dir: Path) -> dict[str, Any]:
    """The run's host count, each round's groups (host, clients, batched) with the round's
    wall and aggregation seconds, and how many updates trained in a group of each size."""
    import pyarrow.parquet as pq

    updates = pq.read_table(run_dir / "updates.parquet", columns=["round", "client_id", "host", "trained_together"]).to_pylist()
    rounds = {row["round"]: row for row in pq.read_table(run_dir / "rounds.parquet", columns=["round", "wall_time_s", "aggregate_s"]).to_pylist()}
    groups: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for row in updates:
        groups.setdefault((row["round"], -1 if row["host"] is None else row["host"]), []).append(row)
    per_round: list[dict[str, Any]] = []
    for round_index in sorted({round_index for round_index, _ in groups} | set(rounds)):
        timing = rounds.get(round_index, {})
        per_round.append({
            "round": round_index,
            "wall_time_s": _rounded(timing.get("wall_time_s")),
            "aggregate_s": _rounded(timing.get("aggregate_s")),
            "groups": [
                {"host": host, "clients": sorted(row["client_id"] for row in rows),
                 "batched": max(int(row["trained_together"] or 1) for row in rows)}
                for (group_round, host), rows in sorted(groups.items()) if group_round == round_index
            ],
        })
    sizes = Counter(int(row["trained_together"] or 1) for row in updates)
    return {
        "hosts": _host_count(run_dir, updates),
        "rounds": per_round,
        "updates_by_group_size": {str(size): sizes[size] for size in sorted(sizes)},
    }


def layout_lines(name: str, layout: dict[str, Any]) -> list[str]:
    """The layout as printed: a header, one line per round, the group sizes."""
    lines = [f"layout {name}: {layout['hosts']} host(s)"]
    for entry in layout["rounds"]:
        timing = f"{entry['wall_time_s']} s" if entry["wall_time_s"] is not None else "no time"
        if entry["aggregate_s"] is not None:
            timing += f", aggregate {entry['aggregate_s']} s"
        groups = "; ".join(f"host {group['host']} [{','.join(map(str, group['clients']))}] batched {group['batched']}"
                           for group in entry["groups"]) or "no updates"
        lines.append(f"  round {entry['round']} ({timing}): {groups}")
    total = sum(layout["updates_by_group_size"].values())
    shares = ", ".join(f"{count} in groups of {size} ({count / total:.0%})" for size, count in layout["updates_by_group_size"].items())
    lines.append(f"  updates: {total}: {shares}" if total else "  updates: none")
    return lines


def _host_count(run_dir: Path, updates: list[dict[str, Any]]) -> int:
    """The manifest's host count, else the hosts that ran an update."""
    manifest = run_dir / "manifest.json"
    if manifest.is_file():
        hosts = (json.loads(manifest.read_text()).get("host_layout") or {}).get("hosts")
        if isinstance(hosts, int):
            return hosts
    return len({row["host"] for row in updates})


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(float(value), 3)
