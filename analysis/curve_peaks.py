"""The report's peak table: each run's best evaluated round beside its final one, so a
row that ended below what it had reached is seen even where its curve fell too gently
for the "falling" flag (analysis/row_flags.py); the best round's value is read off the
test scores and is shown for that, never ranked."""

from __future__ import annotations

import math
from dataclasses import replace

from analysis.final_metrics import RunMetrics, cells
from analysis.report_table import ReportTable, Text, with_std
from analysis.row_flags import flag_note, row_flags

TITLE = "Where the curves peaked: each run's best evaluated round beside its final one (mean client test accuracy, %)"


def peak_table(records: list[RunMetrics]) -> ReportTable | None:
    """Per setting and method: the final mean accuracy, the best evaluated one and its
    round per seed, and the final less the best (per seed, then mean ± std); None when no
    run has a curve (three or more evaluated rounds)."""
    curved = [
        replace(r, values={**r.values, "final_below_peak": r.values["mean_accuracy"] - r.values["peak_accuracy"]})
        for r in records
        if not math.isnan(r.values.get("late_rise", math.nan)) and not math.isnan(r.values.get("peak_accuracy", math.nan))
    ]
    if not curved:
        return None
    table = ReportTable(TITLE, ["Setting", "Method", "Final", "Best evaluated", "Best round (per seed)", "Final - best (pp)", "Flags"])
    final, best, drop = cells(curved, "mean_accuracy"), cells(curved, "peak_accuracy"), cells(curved, "final_below_peak")
    flags = row_flags(records)
    for setting, method in sorted({(r.setting, r.method) for r in curved}):
        runs = sorted((r for r in curved if (r.setting, r.method) == (setting, method)), key=lambda r: r.seed)
        key = (setting, method)
        table.rows.append(
            [
                Text(setting),
                Text(method),
                Text(with_std(final[key])),
                Text(with_std(best[key])),
                Text(", ".join(str(int(r.values["peak_round"])) for r in runs)),
                Text(with_std(drop[key], signed=True)),
                Text("; ".join(flags.get(key, [])) or "-"),
            ]
        )
    table.note = " ".join(
        note
        for note in (
            "Best evaluated: the evaluated round of highest mean client test accuracy in each run (the earliest of ties), "
            "mean ± sample std over seeds. It is picked on the test scores, so it overstates what a run would be stopped "
            "at without them: it is shown to say whether a run ended below what it had reached, not to rank methods by. "
            "Final - best: per seed, then mean ± std; 0 where a run ended at its best.",
            flag_note(flags.get((r.setting, r.method), []) for r in curved),
        )
        if note
    )
    return table
