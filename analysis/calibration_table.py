"""The table of a calibration sweep (`hdcfl-ray calibrate`): one row per value of
the knob and seed, with the groups found, their ARI against the planted groups,
the accuracy and the training budget, and one summary row per value."""

from __future__ import annotations

import math
from statistics import mean

from analysis.report_tables import ReportTable, Text
from analysis.runs import RunRecord


def _number(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) else math.nan


def _value_of(run: RunRecord, key: str) -> object:
    node: object = run.scenario
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _sort_key(value: object) -> tuple[int, float, str]:
    return (0, float(value), "") if isinstance(value, (int, float)) and not isinstance(value, bool) else (1, 0.0, str(value))


def _text(value: float, percent: bool) -> str:
    if math.isnan(value):
        return "-"
    return f"{100 * value:.2f}" if percent else f"{value:.2f}"


def calibration_table(runs: list[RunRecord], key: str) -> ReportTable:
    completed = [run for run in runs if run.status == "completed" and run.final_evaluated_round() is not None]
    table = ReportTable(
        f"Calibration of {key}: groups found, ARI against the planted groups and accuracy per value",
        ["Value", "Method", "Seed", "Groups found", "ARI vs planted", "Mean acc.", "Worst acc.", "Samples trained"],
    )
    by_value: dict[str, list[RunRecord]] = {}
    for run in sorted(completed, key=lambda r: (_sort_key(_value_of(r, key)), r.method, r.seed)):
        by_value.setdefault(str(_value_of(run, key)), []).append(run)
    for value, members in by_value.items():
        finals = [run.final_evaluated_round() or {} for run in members]
        for run, final in zip(members, finals):
            samples = sum(int(row.get("samples_trained") or 0) + int(row.get("eval_samples_trained") or 0) for row in run.rounds.to_pylist())
            groups = final.get("num_groups")
            table.rows.append(
                [
                    Text(value),
                    Text(run.method),
                    Text(str(run.seed)),
                    Text("-" if groups is None else str(groups)),
                    Text(_text(_number(final.get("ari_true")), percent=False)),
                    Text(_text(_number(final.get("mean_accuracy")), percent=True)),
                    Text(_text(_number(final.get("worst_accuracy")), percent=True)),
                    Text(f"{samples:,}"),
                ]
            )
        if len(members) > 1:
            averages = {
                name: [v for v in (_number(f.get(name)) for f in finals) if not math.isnan(v)]
                for name in ("ari_true", "mean_accuracy", "worst_accuracy")
            }
            table.rows.append(
                [
                    Text(value),
                    Text("mean"),
                    Text(f"{len(members)} seeds"),
                    Text(""),
                    Text(_text(mean(averages["ari_true"]) if averages["ari_true"] else math.nan, percent=False)),
                    Text(_text(mean(averages["mean_accuracy"]) if averages["mean_accuracy"] else math.nan, percent=True)),
                    Text(_text(mean(averages["worst_accuracy"]) if averages["worst_accuracy"] else math.nan, percent=True)),
                    Text(""),
                ]
            )
    table.note = (
        f"{len(completed)} completed runs. Groups and ARI are taken at the final evaluation (ARI 1 = the planted groups "
        "exactly, 0 = chance; '-' where the setting plants no groups or the method forms none)."
    )
    return table
