"""Probe: does a clustered method lose accuracy where clients share a model?

For each run of each METHOD under RUNS_DIR (a sweep folder: SETTING/METHOD/seedN) and
Local's run of the same setting and seed there, it pairs the clients' final-round accuracies and splits the clients by
the size of the group they ended in: alone in their group (the method then trains a
model on that client's data only, as Local does) or sharing it with others. A method
that matches Local on its lone clients and falls behind on the shared ones loses its
accuracy to the sharing, not to its implementation.

    python scenarios/cpu/paper-size/probe_shared_models.py runs/paper-size-compare/ls3 pacfl ifca fedce

Writes a Markdown table to stdout: per seed and group-size class, the number of
clients, the method's mean accuracy on them, Local's on the same clients, and the
mean accuracy restricted to the clients' own classes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from collections import Counter
from statistics import mean

import pyarrow.parquet as pq


def final_clients(run_dir: Path) -> dict[int, dict[str, object]]:
    """client id -> its row at the run's last logged round."""
    rows = pq.read_table(run_dir / "clients.parquet").to_pylist()
    last = max(row["round"] for row in rows)
    return {row["client_id"]: row for row in rows if row["round"] == last}


def paired_rows(runs_dir: Path, methods: list[str]) -> list[dict[str, object]]:
    rows = []
    found = [p.parent for method in methods for p in runs_dir.glob(f"*/{method}/seed*/clients.parquet")]
    for run_dir in sorted(found, key=lambda d: (d.parent.parent.name, methods.index(d.parent.name), int(d.name[4:]))):
        setting, method, seed = run_dir.parent.parent.name, run_dir.parent.name, run_dir.name
        local_run = runs_dir / setting / "local" / seed
        if not (local_run / "clients.parquet").exists():
            print(f"no Local run for {setting}/{seed} under {runs_dir}; skipped", file=sys.stderr)
            continue
        ours, local = final_clients(run_dir), final_clients(local_run)
        sizes = Counter(row["group"] for row in ours.values() if row["group"] is not None)
        for label, alone in (("alone in its group", True), ("sharing its group", False)):
            ids = [c for c, row in ours.items() if row["group"] is not None and (sizes[row["group"]] == 1) == alone]
            if not ids:
                continue
            rows.append(
                {
                    "setting": setting, "method": method, "seed": seed.removeprefix("seed"), "clients": label, "n": len(ids),
                    "method_acc": 100 * mean(ours[c]["accuracy"] for c in ids),
                    "own_classes": 100 * mean(ours[c]["accuracy_own_classes"] for c in ids),
                    "local_acc": 100 * mean(local[c]["accuracy"] for c in ids),
                }  # fmt: skip
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs_dir", type=Path, help="a sweep folder (SETTING/METHOD/seedN below it) holding Local's runs too")
    parser.add_argument("methods", nargs="+", help="the clustered methods to probe, e.g. pacfl ifca fedce")
    args = parser.parse_args()
    rows = paired_rows(args.runs_dir, args.methods)
    if not rows:
        sys.exit(f"no runs of {', '.join(args.methods)} with group assignments and a Local run beside them under {args.runs_dir}")
    print("| Setting | Method | Seed | Clients | Count | Method acc. | Method, own classes | Local, same clients |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['setting']} | {row['method']} | {row['seed']} | {row['clients']} | {row['n']} | {row['method_acc']:.2f} | "
            f"{row['own_classes']:.2f} | {row['local_acc']:.2f} |"
        )


if __name__ == "__main__":
    main()
