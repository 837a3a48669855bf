"""Probe: does a clustered method lose accuracy where clients share a model?

For each run of each METHOD under RUNS_DIR (a sweep folder: SETTING/METHOD/seedN) and
Local's run of the same setting and seed there, it pairs the clients' final-round accuracies and splits the clients by
the size of the group they ended in: alone in their group (the method then trains a
model on that client's data only, as Local does) or sharing it with others. A method
that matches Local on its lone clients and falls behind on the shared ones loses its
accuracy to the sharing, not to its implementation.

    python scenarios/cpu/paper-size/probe_shared_models.py runs/paper-size-compare/ls3 pacfl ifca fedce [--out FILE.md]

Writes a Markdown page (to stdout, or to FILE.md): per seed and group-size class, the
number of clients, the method's mean accuracy on them, Local's on the same clients, the
difference and the mean accuracy restricted to the clients' own classes, ending with
the command, the commits, CPU or GPU, torch and Ray of the runs it read.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections import Counter
from pathlib import Path
from statistics import mean

import pyarrow.parquet as pq

from analysis.provenance import provenance_note, run_provenance


def final_clients(run_dir: Path) -> dict[int, dict[str, object]]:
    """client id -> its row at the run's last logged round."""
    rows = pq.read_table(run_dir / "clients.parquet").to_pylist()
    last = max(row["round"] for row in rows)
    return {row["client_id"]: row for row in rows if row["round"] == last}


def paired_rows(runs_dir: Path, methods: list[str]) -> list[dict[str, object]]:
    """One row per (run, group-size class); each row keeps the two run folders it read."""
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
                    "runs": (run_dir, local_run),
                }  # fmt: skip
            )
    return rows


def manifests(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """The manifest of every run the rows read, once each ({} where a run has none)."""
    folders = dict.fromkeys(folder for row in rows for folder in row["runs"])  # type: ignore[union-attr]
    return [json.loads((folder / "manifest.json").read_text()) if (folder / "manifest.json").is_file() else {} for folder in folders]


def page(rows: list[dict[str, object]], command: str) -> str:
    lines = [
        f"<!-- generated: {command} -->",
        "",
        "### Each method's clients paired with Local's same clients, by whether they ended alone in their group",
        "",
        "| Setting | Method | Seed | Clients | Count | Method acc. | Local, same clients | Method minus Local (pp) | Method, own classes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        difference = float(row["method_acc"]) - float(row["local_acc"])  # type: ignore[arg-type]
        lines.append(
            f"| {row['setting']} | {row['method']} | {row['seed']} | {row['clients']} | {row['n']} | {row['method_acc']:.2f} | "
            f"{row['local_acc']:.2f} | {difference:+.2f} | {row['own_classes']:.2f} |"
        )
    note = (
        "Final evaluation, per seed. Groups are the final assignments (argmax membership for methods with soft "
        "memberships). \"Local, same clients\": Local's run of the same seed, which trains each client's model on its own "
        "data only. \"Method, own classes\": the method's predictions restricted to the client's training classes. "
        + provenance_note(run_provenance(manifest) for manifest in manifests(rows))
    )
    return "\n".join([*lines, "", note]) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs_dir", type=Path, help="a sweep folder (SETTING/METHOD/seedN below it) holding Local's runs too")
    parser.add_argument("methods", nargs="+", help="the clustered methods to probe, e.g. pacfl ifca fedce")
    parser.add_argument("--out", type=Path, help="write the page to this file instead of stdout")
    args = parser.parse_args()
    rows = paired_rows(args.runs_dir, args.methods)
    if not rows:
        sys.exit(f"no runs of {', '.join(args.methods)} with group assignments and a Local run beside them under {args.runs_dir}")
    text = page(rows, shlex.join(["python", "scenarios/cpu/paper-size/probe_shared_models.py", *sys.argv[1:]]))
    if args.out is None:
        print(text, end="")
    else:
        args.out.write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
