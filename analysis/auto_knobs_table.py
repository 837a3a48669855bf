"""The report's table of the knobs runs chose for themselves (`auto`): per run and
knob, the values tried with their validation scores, the finalists' means over the
held-out draws, the value chosen and what the
choice cost in samples trained (hdcfl_ray/auto_knobs/record.py says what a run
records). A run that read its choice from the cache trained no candidate itself:
its cost is the one run that made the choice, marked as such."""

from __future__ import annotations

import math
from typing import Any

from analysis.final_metrics import RunMetrics
from analysis.report_table import ReportTable, Text
from hdcfl_ray.auto_knobs.record import Candidate, means_over_draws


def _value(value: Any) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def _score(value: Any) -> str:
    return "-" if not isinstance(value, (int, float)) or math.isnan(value) else f"{100 * value:.2f}"


def _how(candidate: dict[str, Any]) -> str:
    """How a candidate was scored when it did not train a run of its own."""
    if candidate.get("same_run_as") is not None:
        return f" (= {_value(candidate['same_run_as'])})"
    return " (replayed)" if candidate.get("replayed") else ""


def _tried(knob: dict[str, Any]) -> str:
    beyond = set(knob.get("extended") or ())
    tried = ", ".join(
        f"{_value(c.get('value'))}{' (beyond the grid)' if c.get('value') in beyond else ''}: "
        f"{_score(c.get('validation_mean_accuracy'))}{_how(c)}"
        for c in knob.get("candidates") or []
    )
    skipped = knob.get("skipped") or {}
    return tried + (f" ({', '.join(skipped)} skipped)" if skipped else "")


def _finalists(knob: dict[str, Any]) -> str:
    """Rung 2: each finalist's mean over the held-out draws, with the draws' scores."""
    finalists = [Candidate.from_dict(item) for item in knob.get("finalists") or []]
    if not finalists:
        return "-"
    means = means_over_draws(finalists)

    def draws(value: Any) -> str:
        return " / ".join(_score(f.validation_mean_accuracy) for f in finalists if f.value == value)

    return ", ".join(f"{_value(value)}: {_score(mean)} ({draws(value)})" for value, mean in sorted(means.items()))


EDGE_FLAG = "at the grid's edge"


def _chosen(knob: dict[str, Any]) -> Text:
    """The value chosen, flagged when it is the largest or smallest value tried: the best
    value may lie beyond what the grid holds."""
    flags = [f"{EDGE_FLAG} ({'largest' if knob['at_edge'] == 'high' else 'smallest'} value tried)"] if knob.get("at_edge") else []
    return Text(_value(knob.get("chosen")), "best", flags=tuple(flags))


def _leaf(key: Any) -> str:
    return str(key).rsplit(".", 1)[-1]


def _knob(knob: dict[str, Any]) -> str:
    """The knob's name and, in brackets, the method's other auto knobs while it was chosen."""
    held = ", ".join(f"{_leaf(key)} {_value(value)}" for key, value in (knob.get("held") or {}).items())
    return _leaf(knob.get("key", "")) + (f" (at {held})" if held else "")


def auto_knobs_table(records: list[RunMetrics]) -> ReportTable | None:
    """None when no run chose a knob."""
    chose = sorted((r for r in records if isinstance(r.auto_knobs, dict)), key=lambda r: (r.setting, r.method, r.seed))
    if not chose:
        return None
    rows = []
    rules: set[str] = set()
    schedules: set[str] = set()
    for record in chose:
        choice = record.auto_knobs or {}
        rules.add(str(choice.get("rule", "")))
        schedules.add(
            f"{choice.get('rounds')} of {choice.get('full_rounds')} rounds, then the finalists all {choice.get('full_rounds')}, "
            f"{_value(choice.get('validation_fraction'))} of each client's training images held out"
        )
        cached = " (read from the cache: made by an earlier run)" if choice.get("from_cache") else ""
        for knob in choice.get("knobs") or []:
            rows.append(
                [
                    Text(record.method),
                    Text(record.setting),
                    Text(str(record.seed)),
                    Text(_knob(knob)),
                    Text(_tried(knob)),
                    Text(_finalists(knob)),
                    _chosen(knob),
                    Text(f"{int(knob.get('samples_trained') or 0):,}{cached}"),
                ]
            )
    edged = any(knob.get("at_edge") for record in chose for knob in (record.auto_knobs or {}).get("knobs") or [])
    note = (
        f"Each value tried is one shortened run and each finalist one whole run per draw of the held-out images "
        f"({'; '.join(sorted(schedules))}), scored on those images (validation mean accuracy, %: the finalists' mean "
        f"over the draws, each draw's in brackets), never on the test set; chosen by: {'; '.join(sorted(rules))}. "
        "A knob chosen after another is tried at that one's choice (in brackets). (= v): the same run as value v, "
        "which the method declared (trained once); (replayed): scored on a replay of one candidate's saved refreshes "
        "(the knob changes no training); (beyond the grid): tried because the choice landed on the grid's edge."
    )
    if edged:
        note += (
            f" [{EDGE_FLAG}] the value chosen is the largest or smallest value tried, and the method knows no "
            "meaningful value beyond it (or that one did worse): the best value may lie outside the grid."
        )
    return ReportTable(
        title="Knobs the runs chose for themselves (auto)",
        header=[
            "Method", "Setting", "Seed", "Knob", "Values tried: validation mean (%)", "Finalists: mean over the draws (%)", "Chosen",
            "Samples trained for the choice",
        ],
        rows=rows,
        note=note,
    )
