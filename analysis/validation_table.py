"""Runs scored on validation images, reported apart from the test results.

A run with `partition.validation_fraction` scores every client on images held out
of its own training data: the evidence a knob is calibrated on, not a result. Its
numbers would read as test accuracy in the per-setting tables, and averaged over
settings they would move a method's macro value and rank by whether calibration
runs happen to sit beside its test runs. So the report keeps them out of every
test table, macro and rank, and lists them here, one row per setting and method."""

from __future__ import annotations

from analysis.final_metrics import RunMetrics, cells
from analysis.report_table import ReportTable, Text, with_std
from analysis.row_flags import flag_note, metric_flags, row_flags, run_flags

COLUMNS = (("Mean", "mean_accuracy"), ("Worst", "worst_accuracy"), ("Bot.20%", "bottom20_accuracy"), ("Gap (pp)", "gap"))


def validation_table(records: list[RunMetrics]) -> ReportTable | None:
    """The validation-scored runs' final accuracies (mean ± sample std over seeds); None when there are none."""
    if not records:
        return None
    flags = row_flags(records)
    per_metric = {metric: cells(records, metric) for _, metric in COLUMNS}
    table = ReportTable(
        "Validation-scored runs: final accuracy (%) on images held out of each client's training data, not the test set",
        ["Setting", "Method", "Seeds", *(name for name, _ in COLUMNS)],
    )
    for setting, method in sorted({(r.setting, r.method) for r in records}):
        found = flags.get((setting, method))
        seeds = sorted(r.seed for r in records if (r.setting, r.method) == (setting, method))
        row = [Text(setting), Text(method, flags=tuple(run_flags(found))), Text(" / ".join(map(str, seeds)))]
        for _, metric in COLUMNS:  # the runs' flags are said once, on the Method cell; a metric's on its cell
            row.append(Text(with_std(per_metric[metric][(setting, method)]), flags=tuple(metric_flags(found, metric))))
        table.rows.append(row)
    table.note = " ".join(
        note
        for note in (
            ("These runs set partition.validation_fraction: each client was scored on a share of its own training images "
             "held out of its training, the evidence a knob is calibrated on (hdcfl-ray calibrate). They enter no "
             "test-accuracy table, no average rank and no macro value; Local here is Local's validation score."),
            flag_note(cell.flags for row in table.rows for cell in row),
        )
        if note
    )
    return table
