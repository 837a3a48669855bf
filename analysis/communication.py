"""The report's communication table: what each method sent, per participant-round and
in total to its final round (analysis/run_traffic.py), beside its final mean accuracy;
runs logged before the byte columns existed are listed as "not recorded"."""

from __future__ import annotations

import math

from analysis.final_metrics import RunMetrics, cells
from analysis.report_table import ReportTable, Text, with_std
from analysis.row_flags import evidence_flags, flag_note, row_flags
from analysis.run_traffic import MEGABYTE, per_participation, total_megabytes


def megabytes_text(value: float) -> str:
    """Three significant figures (0.0239, 28.7, 1,234), "0" for nothing sent."""
    if math.isnan(value):
        return "not recorded"
    if value == 0:
        return "0"
    decimals = max(0, 2 - math.floor(math.log10(abs(value))))
    return f"{value:,.{decimals}f}"


def communication_table(records: list[RunMetrics]) -> ReportTable | None:
    """Per setting and method: MB up and down per participant-round, MB to the final
    round (training and probes; evaluation downloads apart) and the final mean accuracy,
    means over seeds; None when there are no records."""
    if not records:
        return None
    table = ReportTable(
        "Communication: MB per participant-round and in total to the final round, beside the final mean accuracy (mean over seeds)",
        ["Setting", "Method", "Up / participant-round", "Down / participant-round", "Total up + down", "Evaluation downloads, total",
         "Mean acc."],
    )
    accuracy = cells(records, "mean_accuracy")
    flags = row_flags(records)
    partial = []
    for setting, method in sorted({(r.setting, r.method) for r in records}):
        runs = [r for r in records if (r.setting, r.method) == (setting, method)]
        recorded = [r.values for r in runs if not math.isnan(total_megabytes(r.values))]
        if recorded and len(recorded) < len(runs):
            partial.append(f"{setting}/{method} ({len(recorded)} of {len(runs)} seeds)")

        def mean_of(measure) -> float:
            return sum(measure(values) for values in recorded) / len(recorded) if recorded else math.nan

        table.rows.append(
            [
                Text(setting),
                Text(method, flags=tuple(evidence_flags(flags.get((setting, method))))),
                Text(megabytes_text(mean_of(lambda v: per_participation(v, "bytes_up")))),
                Text(megabytes_text(mean_of(lambda v: per_participation(v, "bytes_down")))),
                Text(megabytes_text(mean_of(total_megabytes))),
                Text(megabytes_text(mean_of(lambda v: v["eval_bytes_down"] / MEGABYTE))),
                Text(with_std(accuracy[(setting, method)])),
            ]
        )
    notes = [
        "Bytes as the runtime moved them (docs/logs.md): the arrays and values of every training job, probe and "
        "update, in MB (10^6 bytes). Per participant-round: the run's total divided by the client updates it "
        "received, so probes sent to every client are charged to the participants. Total: up plus down over all "
        "rounds. Evaluation downloads (the models each evaluated client is sent to be scored) are counted apart. "
        "Not recorded: runs logged before these columns existed, and replays (hdcfl-ray ablate), which re-run a "
        "finished run's server steps and move no bytes of their own."
    ]
    if partial:
        notes.append("Means over the seeds that recorded bytes only: " + ", ".join(partial) + ".")
    notes.append(flag_note(row[1].flags for row in table.rows))
    table.note = " ".join(note for note in notes if note)
    return table
