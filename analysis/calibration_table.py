"""The table of a calibration sweep (`hdcfl-ray calibrate`): one row per value of
the knob and seed, with the accuracy it is chosen by, the groups found, their ARI
against the planted groups and the training budget, one summary row per value,
and the value the selection rule picks.

The rule a real user can apply: the value with the highest final mean accuracy on
the validation images each client held out of its own training data
(`partition.validation_fraction`), averaged over the seeds run; a tie goes to the
value listed first. The test set and the planted groups are never read by the
rule. Runs scored on the test set (`--oracle`) are labelled oracle, and so is the
ARI column wherever it appears: a user of PACFL, IFCA or FedCE has no planted
groups to compare with."""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import mean

from analysis.provenance import provenance_note, run_provenance
from analysis.report_table import ReportTable, Text
from analysis.runs import RunRecord
from analysis.setting_groups import check_calibration_runs

SELECTION_RULE = (
    "highest final mean client accuracy on validation images held out of each client's training data, "
    "averaged over seeds (ties: the smaller value)"
)


@dataclass(frozen=True)
class CalibrationChoice:
    value: str | None  # None where no value was chosen (oracle runs, nothing finished)
    rule: str
    scored_on: str  # "validation" or "test (oracle)"


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


def _mean_of(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return mean(finite) if finite else math.nan


def choose_value(runs: list[RunRecord], key: str) -> CalibrationChoice:
    """The value the selection rule picks among completed validation-scored runs;
    none when any run was scored on the test set (an oracle table chooses nothing)."""
    completed = [run for run in runs if run.status == "completed" and run.final_evaluated_round() is not None]
    if not completed or len(completed) < len(runs):  # a value missing a run cannot be ranked yet
        return CalibrationChoice(None, SELECTION_RULE, "validation")
    if not all(run.scored_on_validation for run in completed):
        return CalibrationChoice(None, SELECTION_RULE, "test (oracle)")
    by_value: dict[str, list[float]] = {}
    for run in sorted(completed, key=lambda r: _sort_key(_value_of(r, key))):
        final = run.final_evaluated_round() or {}
        by_value.setdefault(str(_value_of(run, key)), []).append(_number(final.get("mean_accuracy")))
    scores = {value: _mean_of(accuracies) for value, accuracies in by_value.items()}
    ranked = [value for value in scores if not math.isnan(scores[value])]
    best = max(ranked, key=lambda value: scores[value]) if ranked else None  # max keeps the first of equals
    return CalibrationChoice(best, SELECTION_RULE, "validation")


def calibration_table(runs: list[RunRecord], key: str) -> ReportTable:
    """ScenarioError where the runs differ in more than `key` or repeat a value and seed."""
    completed = [run for run in runs if run.status == "completed" and run.final_evaluated_round() is not None]
    check_calibration_runs(completed, key)  # one setting, one knob: what the report's grouping asks of a column
    validation = bool(completed) and all(run.scored_on_validation for run in completed)
    accuracy_label = "validation" if validation else "test (oracle)"
    table = ReportTable(
        f"Calibration of {key}: accuracy on {accuracy_label} images, groups found and budget per value",
        [
            "Value",
            "Method",
            "Seed",
            f"Mean acc. ({accuracy_label})",
            f"Worst acc. ({accuracy_label})",
            "Groups found",
            "ARI vs planted (oracle)",
            "Samples trained",
        ],
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
                    Text(_text(_number(final.get("mean_accuracy")), percent=True)),
                    Text(_text(_number(final.get("worst_accuracy")), percent=True)),
                    Text("-" if groups is None else str(groups)),
                    Text(_text(_number(final.get("ari_true")), percent=False)),
                    Text(f"{samples:,}"),
                ]
            )
        if len(members) > 1:
            table.rows.append(
                [
                    Text(value),
                    Text("mean"),
                    Text(f"{len(members)} seeds"),
                    Text(_text(_mean_of([_number(f.get("mean_accuracy")) for f in finals]), percent=True)),
                    Text(_text(_mean_of([_number(f.get("worst_accuracy")) for f in finals]), percent=True)),
                    Text(""),
                    Text(_text(_mean_of([_number(f.get("ari_true")) for f in finals]), percent=False)),
                    Text(""),
                ]
            )
    choice = choose_value(runs, key)
    if choice.value is not None:
        chosen = f"Chosen: {key} = {choice.value} by the rule: {choice.rule}."
    elif completed and not validation:
        chosen = (
            "No value chosen: these runs were scored on the test set (--oracle), which a real user of the method "
            "does not have; rerun without --oracle to choose on held-out training data."
        )
    elif len(completed) < len(runs):
        unfinished = ", ".join(sorted(f"{run.run_dir.parent.parent.name} ({run.status})" for run in runs if run not in completed))
        chosen = f"No value chosen yet: {len(runs) - len(completed)} run(s) not finished: {unfinished}; rerun the same command to finish them."
    else:
        chosen = "No value chosen: no run finished."
    table.note = (
        f"{len(completed)} completed runs. {chosen} Groups and ARI are taken at the final evaluation (ARI 1 = the "
        "planted groups exactly, 0 = chance; '-' where the setting plants no groups or the method forms none); ARI "
        "reads the planted groups, an oracle no user has, so it is shown as evidence and never used to choose."
    )
    source = provenance_note(run_provenance(run.manifest) for run in completed)
    if source:  # which code and machine made the numbers, as every report table says
        table.note += " " + source
    return table
