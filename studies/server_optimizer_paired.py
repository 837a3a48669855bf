"""Does a FedAdam server step change what a method reaches and the groups it finds?

Reads two sweep folders per setting (the plain average, `protocol.server_optimizer` sgd at
lr 1, and the same sweep with FedAdam) and writes, per setting and method, the final
scores of both, their per-seed differences (FedAdam minus plain) and the paired verdict of
analysis/verdict.py, with the groups found (ARI against the planted groups, groups) and
the bytes; and one figure per setting of each method's mean accuracy by round under both
server steps (where the curves flatten).

    python -m studies.server_optimizer_paired \\
        --pair rotation runs/server-optimizer/rot-sgd runs/server-optimizer/rot-fedadam \\
        --pair label-skew runs/server-optimizer/ls3-sgd runs/server-optimizer/ls3-fedadam \\
        --out docs/server-optimizer-study-tables.md --figures docs/figures

The sweeps: scenarios/sweeps/server-optimizer-{rot,ls3}-{sgd,fedadam}.yaml.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from statistics import mean, stdev

from analysis.final_metrics import RunMetrics, run_metrics
from analysis.run_traffic import total_megabytes
from analysis.runs import RunRecord, load_runs
from analysis.verdict import RULE, paired_verdict

# (metric, label, scale): accuracies and ARI in points
COMPARED = (("mean_accuracy", "mean acc.", 100.0), ("worst_accuracy", "worst acc.", 100.0), ("ari_true", "ARI", 100.0))


@dataclass(frozen=True)
class Side:
    records: dict[tuple[str, int], RunMetrics]
    runs: dict[tuple[str, int], RunRecord]


def _side(folder: Path) -> Side:
    runs = [run for run in load_runs([folder]) if run.finished]
    records = run_metrics(runs)
    return Side(
        records={(record.method, record.seed): record for record in records},
        runs={(str(run.scenario["algorithm"]["name"]), int(run.scenario["seed"])): run for run in runs},
    )


def _cell(values: list[float]) -> str:
    finite = [value for value in values if not math.isnan(value)]
    if not finite:
        return "-"
    return f"{mean(finite):.2f} ± {stdev(finite):.2f}" if len(finite) > 1 else f"{finite[0]:.2f}"


def setting_rows(name: str, plain: Side, adam: Side) -> list[str]:
    rows = []
    for method in sorted({method for method, _ in plain.records} & {method for method, _ in adam.records}):
        seeds = sorted(seed for m, seed in plain.records if m == method and (method, seed) in adam.records)
        cells = [name, method, ", ".join(map(str, seeds))]
        for metric, _, scale in COMPARED:
            before = [scale * plain.records[(method, seed)].values.get(metric, math.nan) for seed in seeds]
            after = [scale * adam.records[(method, seed)].values.get(metric, math.nan) for seed in seeds]
            diffs = [b - a for a, b in zip(before, after)]
            verdict = "-" if any(math.isnan(d) for d in diffs) else paired_verdict(diffs)
            shown = "-" if all(math.isnan(d) for d in diffs) else " / ".join("-" if math.isnan(d) else f"{d:+.2f}" for d in diffs)
            cells += [_cell(before), _cell(after), shown, verdict]
        groups = [
            f"{_cell([plain.records[(method, s)].values.get('num_groups', math.nan) for s in seeds])} -> "
            f"{_cell([adam.records[(method, s)].values.get('num_groups', math.nan) for s in seeds])}"
        ]
        megabytes = [
            f"{_cell([total_megabytes(plain.records[(method, s)].values) for s in seeds])} / "
            f"{_cell([total_megabytes(adam.records[(method, s)].values) for s in seeds])}"
        ]
        rows.append("| " + " | ".join(cells + groups + megabytes) + " |")
    return rows


def reference_rows(name: str, plain: Side) -> list[str]:
    """The trivial references the runs recorded (the same partition for every method of a
    seed): mean and worst client accuracy over the seeds, in the plain columns."""
    by_reference: dict[str, dict[int, dict[str, float]]] = {}
    for (_, seed), record in plain.records.items():
        for reference, summary in (record.trivial_references or {}).items():
            by_reference.setdefault(reference, {})[seed] = summary
    rows = []
    for reference, by_seed in sorted(by_reference.items()):
        seeds = sorted(by_seed)
        cells = [name, f"*reference: {reference}*", ", ".join(map(str, seeds))]
        for metric, _, scale in COMPARED:
            values = [scale * by_seed[seed].get(metric, math.nan) for seed in seeds]
            cells += [_cell(values), "-", "-", "-"] if metric != "ari_true" else ["-", "-", "-", "-"]
        rows.append("| " + " | ".join(cells + ["-", "-"]) + " |")
    return rows


def curves_figure(name: str, plain: Side, adam: Side, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = sorted({method for method, _ in plain.runs} & {method for method, _ in adam.runs})
    figure, axes = plt.subplots(1, len(methods), figsize=(4.2 * len(methods), 3.2), squeeze=False)
    for axis, method in zip(axes[0], methods):
        seeds = sorted({seed for m, seed in [*plain.runs, *adam.runs] if m == method})
        for side, label, style in ((plain, "plain average", "-"), (adam, "FedAdam", "--")):
            for (m, seed), run in sorted(side.runs.items()):
                if m != method:
                    continue
                rows = [row for row in run.rounds.to_pylist() if row.get("mean_accuracy") is not None]
                axis.plot([row["round"] for row in rows], [100.0 * row["mean_accuracy"] for row in rows], style,
                          color=f"C{seeds.index(seed)}", label=f"{label}, seed {seed}", linewidth=1.2)
        axis.set_title(f"{name}: {method}")
        axis.set_xlabel("round")
        axis.set_ylabel("mean client accuracy (%)")
        axis.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    figure.tight_layout()
    path = out / f"server-optimizer-{name}.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", nargs=3, action="append", metavar=("SETTING", "PLAIN_SWEEP", "FEDADAM_SWEEP"), required=True)
    parser.add_argument("--out", type=Path, required=True, help="the Markdown tables")
    parser.add_argument("--figures", type=Path, default=None, help="folder for one curves figure per setting")
    args = parser.parse_args(argv)
    header = ["Setting", "Method", "Seeds"]
    for _, label, _ in COMPARED:
        header += [f"{label} plain", f"{label} FedAdam", f"{label} diff. per seed", f"{label} verdict"]
    header += ["groups plain -> FedAdam", "MB plain / FedAdam"]
    lines = [
        "<!-- generated by: python -m studies.server_optimizer_paired "
        + " ".join(f"--pair {name} {plain} {adam}" for name, plain, adam in args.pair)
        + f" --out {args.out}" + (f" --figures {args.figures}" if args.figures else "") + " -->",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    figures = []
    for name, plain_dir, adam_dir in args.pair:
        plain, adam = _side(Path(plain_dir)), _side(Path(adam_dir))
        lines += setting_rows(name, plain, adam) + reference_rows(name, plain)
        if args.figures is not None:
            args.figures.mkdir(parents=True, exist_ok=True)
            figures.append(curves_figure(name, plain, adam, args.figures))
    lines += [
        "",
        "Final round, mean ± sample std over the seeds; ARI against the planted groups (x100); 'diff. per seed' is "
        f"FedAdam minus the plain average, seed by seed. Verdict of FedAdam against the plain average: {RULE}. "
        "MB: training traffic up plus down over the run, per seed averaged. *reference* rows: the trivial references the "
        "runs recorded (each client's own majority class, or the pooled one, scored on its test set): what a model that "
        "learned nothing but the label counts reaches.",
    ]
    args.out.write_text("\n".join(lines) + "\n")
    for path in figures:
        print(f"wrote {path}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
