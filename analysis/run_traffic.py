"""A run's logged bytes (rounds.parquet's `bytes_up`, `bytes_down` and `eval_bytes_down`,
docs/logs.md) summed to its final round, and the per-update and total megabytes the
report's communication table and figure show.

Megabytes are 10^6 bytes. "Per participant-round" divides a run's total by the
client updates it received (the sum of `num_participants`), so a probe sent to
every client (PACFL's subspaces, FedSoft's importance estimates) is charged to the
rounds' participants. Runs logged before the columns existed have no totals (NaN).
"""

from __future__ import annotations

import math

TRAFFIC_COLUMNS = ("bytes_up", "bytes_down", "eval_bytes_down")
PARTICIPATIONS = "participations"  # client updates received over the run
MEGABYTE = 1e6


def run_traffic(rounds: list[dict[str, object]]) -> dict[str, float]:
    """A run's bytes summed over its rounds and the client updates they carried; NaN
    where any round lacks a column (a run logged before it, or a replay)."""
    totals: dict[str, float] = {}
    for column in (*TRAFFIC_COLUMNS, "num_participants"):
        present = [row.get(column) for row in rounds if row.get(column) is not None]
        totals[column] = float(sum(present)) if rounds and len(present) == len(rounds) else math.nan  # type: ignore[arg-type]
    totals[PARTICIPATIONS] = totals.pop("num_participants")
    return totals


def total_megabytes(values: dict[str, float]) -> float:
    """Training and probe traffic, up plus down, to the final round (MB; NaN if not recorded)."""
    return (values.get("bytes_up", math.nan) + values.get("bytes_down", math.nan)) / MEGABYTE


def per_participation(values: dict[str, float], column: str) -> float:
    """MB of `column` per client update (NaN when not recorded or no client trained)."""
    updates = values.get(PARTICIPATIONS, math.nan)
    if math.isnan(updates) or updates == 0:
        return math.nan
    return values.get(column, math.nan) / MEGABYTE / updates
