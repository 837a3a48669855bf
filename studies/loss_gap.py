"""Did a method's models fit their clients' training data beyond what carries to their test data?

A row whose accuracy passed its best and went down (the report's `falling` flag, or its
"Where the curves peaked" table) is either overfitting or diverging; the losses tell which.
Reads the finished runs of one or more sweep or run folders and writes, per setting and
method, at a quarter, half, three quarters and all of each run's rounds (the first
evaluated round at or after each): the mean training loss of that round's local updates
(`rounds.parquet`, `mean_train_loss`), the mean test loss of the evaluated clients' scored
models (`clients.parquet`, `loss`: the models the accuracy is scored with) and the mean
client accuracy, each mean ± sample std over the seeds. Overfitting shows as a training loss
that keeps falling while the test loss rises; divergence as both rising.

    python -m studies.loss_gap results/natural-standins-120 --out docs/natural-standin-loss-gap.md
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import mean, stdev

from analysis.provenance import provenance_note, run_provenance
from analysis.runs import RunRecord, left_out_note, load_runs, unfinished

# the points of each run's rounds the table is read at, as shares of its rounds
SHARES = (0.25, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class LossPoint:
    round: int
    train_loss: float  # mean over the round's local updates; NaN where the round logged none
    test_loss: float  # mean over the evaluated clients
    accuracy: float  # mean client accuracy, a fraction


def loss_points(run: RunRecord, shares: Sequence[float] = SHARES) -> list[LossPoint]:
    """The run's losses at the first evaluated round at or after each share of its rounds."""
    rounds = {int(row["round"]): row for row in run.rounds.to_pylist()}
    evaluated = sorted(r for r, row in rounds.items() if row.get("evaluated"))
    if not evaluated:
        return []
    test_losses: dict[int, list[float]] = {}
    for client_round, loss in zip(run.clients.column("round").to_pylist(), run.clients.column("loss").to_pylist()):
        if loss is not None and not math.isnan(loss):
            test_losses.setdefault(int(client_round), []).append(float(loss))
    last = evaluated[-1]
    points = []
    for share in shares:
        at = next(r for r in evaluated if r >= share * last)
        row = rounds[at]
        train = row.get("mean_train_loss")
        points.append(
            LossPoint(
                at,
                math.nan if train is None else float(train),
                mean(test_losses[at]) if test_losses.get(at) else math.nan,
                float(row["mean_accuracy"]),
            )
        )
    return points


def _cell(values: list[float], scale: float = 1.0) -> str:
    present = [scale * v for v in values if not math.isnan(v)]
    if not present:
        return "-"
    return f"{mean(present):.2f}" + (f" ± {stdev(present):.2f}" if len(present) > 1 else "")


def table_lines(runs: list[RunRecord]) -> list[str]:
    header = ["Setting", "Method", "Seeds"] + [f"{int(100 * share)}% of rounds: round, train / test loss, acc. (%)" for share in SHARES]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    groups: dict[tuple[str, str], list[RunRecord]] = {}
    for run in runs:
        groups.setdefault((run.setting, run.method), []).append(run)
    for (setting, method), group in sorted(groups.items()):
        group.sort(key=lambda run: run.seed)
        per_run = [loss_points(run) for run in group]
        cells = []
        for index in range(len(SHARES)):
            points = [points[index] for points in per_run if len(points) > index]
            at = sorted({point.round for point in points})
            cells.append(
                f"{', '.join(map(str, at))}: {_cell([p.train_loss for p in points])} / {_cell([p.test_loss for p in points])}, "
                f"{_cell([p.accuracy for p in points], 100.0)}"
            )
        lines.append("| " + " | ".join([setting, method, ", ".join(str(run.seed) for run in group), *cells]) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path, help="sweep or run folders")
    parser.add_argument("--out", type=Path, help="write the Markdown here (default: print it)")
    args = parser.parse_args(argv)
    everything = load_runs(args.paths)
    runs = [run for run in everything if run.finished]
    if not runs:
        parser.error(f"no finished run under {', '.join(map(str, args.paths))}")
    command = "python -m studies.loss_gap " + " ".join(map(str, args.paths)) + (f" --out {args.out}" if args.out else "")
    note = " ".join(
        part
        for part in (
            "Train loss: the mean training loss of the round's local updates; test loss: the mean over the evaluated "
            "clients of the loss of the model their accuracy is scored with; mean ± sample std over the seeds. A "
            "training loss that keeps falling while the test loss rises is overfitting; both rising is divergence.",
            left_out_note(unfinished(everything)),
            provenance_note(run_provenance(run.manifest) for run in runs),
        )
        if part
    )
    text = "\n".join([f"<!-- generated by: {command} -->", "", "### Training and test loss over each run's rounds", "",
                      *table_lines(runs), "", note, ""])  # fmt: skip
    if args.out:
        args.out.write_text(text)
        print(f"wrote {args.out}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
