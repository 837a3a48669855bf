"""NIID-Bench's CIFAR-10 Dir(0.5) row as this simulator ran it: per sweep folder, method and
seed, the global model's accuracy on the whole test split at its best round (the measure of
Flower's baselines/niid_bench table) and at the last round run, how many of the planned
rounds ran, and the trivial reference the run recorded (the majority class); then a figure
of every run's accuracy by round.

    python -m studies.niid_bench_table runs/niid-bench runs/niid-bench-augmented \\
        --out docs/niid-bench-tables.md --figure docs/figures/niid-bench-curves.png

Runs still in progress (or stopped) are listed with the rounds they reached, never as
finished: the table says "partial, N of 50 rounds". Scenarios: scenarios/niid-bench/.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from statistics import mean, stdev

import pyarrow.parquet as pq

METHOD_ORDER = ("fedavg", "fedprox", "scaffold", "fednova")


@dataclass(frozen=True)
class NiidRun:
    sweep: str
    variant: str
    method: str
    seed: int
    planned_rounds: int
    accuracy_by_round: dict[int, float]
    majority: float

    @property
    def rounds_run(self) -> int:
        return max(self.accuracy_by_round, default=0)

    @property
    def best(self) -> tuple[int, float]:
        round_index = max(self.accuracy_by_round, key=lambda r: (self.accuracy_by_round[r], -r))
        return round_index, self.accuracy_by_round[round_index]

    @property
    def final(self) -> float:
        return self.accuracy_by_round[self.rounds_run]


def _variant(scenario: dict) -> str:
    augmentation = (scenario.get("dataset") or {}).get("augmentation") or {}
    server = ((scenario.get("protocol") or {}).get("server_optimizer") or {}).get("name", "sgd")
    parts = ["crop + flip" if augmentation.get("crop_padding") or augmentation.get("horizontal_flip") else "no augmentation"]
    if server != "sgd":
        parts.append(f"server {server}")
    return ", ".join(parts)


def read_runs(sweep: Path) -> list[NiidRun]:
    import yaml

    runs = []
    for rounds_file in sorted(sweep.glob("*/*/seed*/rounds.parquet")):
        run_dir = rounds_file.parent
        scenario = yaml.safe_load((run_dir / "scenario.yaml").read_text())
        table = pq.read_table(rounds_file, columns=["round", "mean_accuracy"]).to_pylist()
        accuracy = {int(row["round"]): float(row["mean_accuracy"]) for row in table if row["mean_accuracy"] is not None}
        if not accuracy:
            continue
        manifest = json.loads((run_dir / "manifest.json").read_text()) if (run_dir / "manifest.json").is_file() else {}
        references = (manifest.get("trivial_references") or {}).get("references") or {}
        majority = (references.get("majority class (pooled)") or {}).get("mean_accuracy")
        runs.append(
            NiidRun(
                sweep=str(sweep), variant=_variant(scenario), method=str(scenario["algorithm"]["name"]),
                seed=int(scenario["seed"]), planned_rounds=int(scenario["protocol"]["rounds"]), accuracy_by_round=accuracy,
                majority=float(majority) if isinstance(majority, (int, float)) else math.nan,
            )
        )
    return runs


def _spread(values: list[float]) -> str:
    return f"{mean(values):.2f} ± {stdev(values):.2f}" if len(values) > 1 else f"{values[0]:.2f}"


def table_lines(runs: list[NiidRun]) -> list[str]:
    lines = [
        "| Variant | Method | Seed | Rounds run | Best round: accuracy (round) | Last round's accuracy | Majority class (pooled) |",
        "|---|---|---|---|---|---|---|",
    ]
    key = lambda run: (run.variant, METHOD_ORDER.index(run.method) if run.method in METHOD_ORDER else 99, run.method, run.seed)
    for run in sorted(runs, key=key):
        best_round, best = run.best
        state = f"{run.rounds_run} of {run.planned_rounds}" + ("" if run.rounds_run == run.planned_rounds else " (partial)")
        majority = "-" if math.isnan(run.majority) else f"{100 * run.majority:.2f}"
        lines.append(
            f"| {run.variant} | {run.method} | {run.seed} | {state} | {100 * best:.2f} ({best_round}) | {100 * run.final:.2f} | {majority} |"
        )
    finished: dict[tuple[str, str], list[NiidRun]] = {}
    for run in runs:
        if run.rounds_run == run.planned_rounds:
            finished.setdefault((run.variant, run.method), []).append(run)
    if finished:
        lines += ["", "Finished runs over their seeds (mean ± sample std where more than one seed finished):", "",
                  "| Variant | Method | Seeds | Best round | Last round |", "|---|---|---|---|---|"]
        for (variant, method), group in sorted(finished.items()):
            lines.append(
                f"| {variant} | {method} | {', '.join(str(run.seed) for run in sorted(group, key=lambda r: r.seed))} | "
                f"{_spread([100 * run.best[1] for run in group])} | {_spread([100 * run.final for run in group])} |"
            )
    return lines


def curves(runs: list[NiidRun], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7.5, 4.2))
    for index, run in enumerate(sorted(runs, key=lambda r: (r.variant, r.method, r.seed))):
        rounds = sorted(run.accuracy_by_round)
        style = "-" if run.variant.startswith("crop") else "--"
        axis.plot(rounds, [100 * run.accuracy_by_round[r] for r in rounds], style, color=f"C{index}",
                  label=f"{run.method}, seed {run.seed}, {run.variant}", linewidth=1.2)
    majority = [run.majority for run in runs if not math.isnan(run.majority)]
    if majority:
        axis.axhline(100 * majority[0], color="grey", linewidth=0.8, linestyle=":", label="majority class")
    axis.set_xlabel("round")
    axis.set_ylabel("global model, whole test split (%)")
    axis.set_title("NIID-Bench CIFAR-10 Dir(0.5), 10 clients, 10 local epochs")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, loc="lower right")
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweeps", nargs="+", type=Path, help="sweep folders of scenarios/niid-bench")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--figure", type=Path, default=None)
    args = parser.parse_args(argv)
    runs = [run for sweep in args.sweeps for run in read_runs(sweep)]
    if not runs:
        parser.error(f"no run with an evaluated round in {', '.join(map(str, args.sweeps))}")
    command = "python -m studies.niid_bench_table " + " ".join(map(str, args.sweeps)) + f" --out {args.out}" + (
        f" --figure {args.figure}" if args.figure else "")
    lines = [f"<!-- generated by: {command} -->", "", *table_lines(runs), "",
             "Accuracy: the global model on the whole CIFAR-10 test split (10,000 images; `partition.test_set: "
             "whole_split`), in %. Best round: the highest over the rounds run (Flower's measure), with its round."]
    args.out.write_text("\n".join(lines) + "\n")
    if args.figure is not None:
        curves(runs, args.figure)
        print(f"wrote {args.figure}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
