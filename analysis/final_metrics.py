"""Final-round client accuracy per (setting, method): mean +- sample std over seeds."""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import mean, stdev

from analysis.runs import RunRecord

METRICS = ("mean_accuracy", "worst_accuracy", "bottom20_accuracy", "gap", "mean_accuracy_global")


@dataclass(frozen=True)
class FinalMetricsRow:
    setting: str
    algorithm: str
    seeds: tuple[int, ...]
    means: dict[str, float]  # metric -> mean over seeds (fractions)
    stds: dict[str, float]  # metric -> sample std over seeds (NaN for one seed)


def final_metrics_table(runs: list[RunRecord]) -> list[FinalMetricsRow]:
    groups: dict[tuple[str, str], list[tuple[int, dict]]] = {}
    for run in runs:
        final = run.final_evaluated_round()
        if final is not None and run.status == "completed":
            groups.setdefault((run.setting, run.algorithm), []).append((run.seed, final))
    rows = []
    for (setting, algorithm), entries in sorted(groups.items()):
        entries.sort()
        means, stds = {}, {}
        for metric in METRICS:
            values = [float(final[metric]) for _, final in entries if final.get(metric) is not None]
            means[metric] = mean(values) if values else math.nan
            stds[metric] = stdev(values) if len(values) > 1 else math.nan
        rows.append(FinalMetricsRow(setting, algorithm, tuple(seed for seed, _ in entries), means, stds))
    return rows


def format_markdown(rows: list[FinalMetricsRow]) -> str:
    header = "| setting | method | seeds | mean | worst | bottom-20% | gap (pp) | global encoder mean |"
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        cells = [_cell(row, metric) for metric in METRICS]
        lines.append(f"| {row.setting} | {row.algorithm} | {', '.join(map(str, row.seeds))} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(row: FinalMetricsRow, metric: str) -> str:
    value, spread = row.means[metric], row.stds[metric]
    if math.isnan(value):
        return "-"
    if math.isnan(spread):
        return f"{100 * value:.2f}"
    return f"{100 * value:.2f} ± {100 * spread:.2f}"
