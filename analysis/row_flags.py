"""Warnings a report prints on its cells, so that a table copied into a paper
carries them: a clustered method that collapsed, a method far below Local, a
row with fewer seeds than the others, a curve still rising or falling when the run
stopped (hdcfl_ray/diagnostics/curve_trend.py), figures scored on a sample of the clients, a
knob pinned to a value chosen for another setting, a method not above a trivial
reference (analysis/trivial_rows.py).

Each flag follows a stated rule over the runs behind a setting's row
(FLAG_RULES), and every table that shows a flag repeats its rule in its note. A
flag defined on one metric (FLAG_METRICS) marks only that metric's cells; the
others describe the runs themselves and mark every cell made from them. Tables
derived from several settings or from pairs of runs carry the flags that say how
much evidence is behind them (EVIDENCE_FLAGS)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from statistics import mean, stdev

from analysis.final_metrics import RunMetrics
from analysis.trivial_rows import TRIVIAL_FLAG, TRIVIAL_RULE, trivial_flags
from hdcfl_ray.diagnostics.curve_trend import FALLING_RULE, RISING_RULE, still_falling, still_rising

# a mean normalised membership entropy at or above this is "uniform": every client
# spreads its weight almost evenly over the method's clusters
UNIFORM_ENTROPY = 0.95
LOCAL = "local"

FLAG_RULES = {
    "one group": "collapsed: a clustered method ended with one group where the partition plants several and the method was not set to form one (in at least one seed)",
    "one cluster per client": "collapsed: a clustering method ended with as many groups as clients, each client in a cluster of its own: the same as Local (in at least one seed; the value that did it in brackets)",
    "uniform memberships": f"collapsed: mean normalised membership entropy >= {UNIFORM_ENTROPY} (every client spread evenly over the clusters; in at least one seed)",
    "worst client 0%": "the worst client scored 0% in at least one seed",
    "below Local": "mean accuracy below Local's in the same setting by more than the larger of the two seed stds (with one seed: below at all)",
    TRIVIAL_FLAG: TRIVIAL_RULE,
    "still rising": RISING_RULE,
    "falling": FALLING_RULE,
    "fewer seeds": "fewer seeds than the most any method has in this setting",
    "sampled evaluation": "the accuracies summarise a seeded sample of the clients (protocol.eval_clients), not all of them, in at least one seed",
    "host layout changed": "a batched run was resumed with its clients on other hosts (simulate --resume --allow-layout-change), so from then on they trained in other batches than an uninterrupted run's; its numbers are not that run's bits (in at least one seed)",
    "pinned for another setting": "a knob of the method was pinned to a value chosen for another dataset, partition or model (the scenario's chosen_for names another data setting than the run's), where it may be far from this setting's best; the run warned at its start and its manifest records it (pinned_for_another_setting; in at least one seed; the knobs and values in brackets)",
    "paired on fewer seeds": "the method and the reference share fewer seeds than the most any method has in this setting: the differences and verdict use the shared seeds only",
}
# the one metric a flag is defined on; a flag not named here describes the runs behind a
# row (how they grouped, how many there are, how many clients they scored) and marks every metric
FLAG_METRICS = {"worst client 0%": "worst_accuracy", "below Local": "mean_accuracy", TRIVIAL_FLAG: "mean_accuracy"}
# the flags that say how much evidence is behind a number, which every table derived from
# the runs (macro averages, paired differences, gains) repeats
EVIDENCE_FLAGS = ("still rising", "falling", "fewer seeds", "sampled evaluation", "host layout changed", "pinned for another setting")


def row_flags(records: list[RunMetrics]) -> dict[tuple[str, str], list[str]]:
    """(setting, method) -> the flags that apply, in FLAG_RULES order."""
    grouped: dict[tuple[str, str], list[RunMetrics]] = {}
    for record in records:
        grouped.setdefault((record.setting, record.method), []).append(record)
    most_seeds = {setting: max(len(runs) for (s, _), runs in grouped.items() if s == setting) for setting, _ in grouped}
    not_above_trivial = trivial_flags(records)
    flags: dict[tuple[str, str], list[str]] = {}
    for (setting, method), runs in grouped.items():
        found = []
        if any(_value(r, "num_groups") == 1 and not math.isnan(_value(r, "ari_true")) and _value(r, "groups_asked") != 1 for r in runs):
            found.append("one group")
        singletons = [r for r in runs if _one_per_client(r) and method != LOCAL]
        if singletons:
            found.append(f"one cluster per client ({_cause(singletons)})")
        if any(_value(r, "membership_entropy") >= UNIFORM_ENTROPY for r in runs):
            found.append("uniform memberships")
        if any(_value(r, "worst_accuracy") == 0.0 for r in runs):
            found.append("worst client 0%")
        local = grouped.get((setting, LOCAL))
        if method != LOCAL and local and _below(runs, local):
            found.append("below Local")
        if (setting, method) in not_above_trivial:
            found.append(not_above_trivial[(setting, method)])
        if still_rising(*([_value(r, name) for r in runs] for name in ("late_rise", "total_rise", "late_rise_error"))):
            found.append(f"still rising ({_late_rise(runs)})")
        elif still_falling(*([_value(r, name) for r in runs] for name in ("late_rise", "late_rise_error"))):
            found.append(f"falling ({_late_rise(runs)})")
        if len(runs) < most_seeds[setting]:
            found.append(f"fewer seeds ({len(runs)} of {most_seeds[setting]})")
        sampled = [_value(r, "evaluated_fraction") for r in runs if _value(r, "evaluated_fraction") < 1.0]
        if sampled:
            found.append(f"sampled evaluation ({100 * min(sampled):.3g}% of the clients)")
        changed = sum(1 for r in runs if _value(r, "host_layout_changes") > 0)
        if changed:
            found.append(f"host layout changed ({changed} of {len(runs)} seed{'' if len(runs) == 1 else 's'})")
        pinned = _pinned_elsewhere(runs)
        if pinned:
            found.append(f"pinned for another setting ({pinned})")
        if found:
            flags[(setting, method)] = found
    return flags


def flag_name(flag: str) -> str:
    """The rule's name of a flag as shown: "fewer seeds (2 of 3)" -> "fewer seeds"."""
    return flag.split(" (", 1)[0]


def cell_flags(found: list[str] | None, metric: str) -> list[str]:
    """Of a row's flags, those that describe its `metric` cell."""
    return [flag for flag in found or [] if FLAG_METRICS.get(flag_name(flag), metric) == metric]


def run_flags(found: list[str] | None) -> list[str]:
    """Of a row's flags, those that describe its runs rather than one metric (a collapse, the seeds, the sample)."""
    return [flag for flag in found or [] if flag_name(flag) not in FLAG_METRICS]


def metric_flags(found: list[str] | None, metric: str) -> list[str]:
    """Of a row's flags, those defined on `metric` alone."""
    return [flag for flag in found or [] if FLAG_METRICS.get(flag_name(flag)) == metric]


def evidence_flags(found: list[str] | None) -> list[str]:
    """Of a row's flags, those that say how much evidence is behind it (EVIDENCE_FLAGS)."""
    return [flag for flag in found or [] if flag_name(flag) in EVIDENCE_FLAGS]


def flag_note(shown: Iterable[Iterable[str]]) -> str:
    """The rules of the flags shown (each cell's flags), for a table's note ('' when none is)."""
    used = {flag_name(flag) for flags in shown for flag in flags}
    rules = [f"[{name}] {rule}" for name, rule in FLAG_RULES.items() if name in used]
    return ("Flags: " + "; ".join(rules) + ".") if rules else ""


def _one_per_client(record: RunMetrics) -> bool:
    groups, clients = _value(record, "num_groups"), _value(record, "num_clients")
    return not math.isnan(_value(record, "ari_true")) and groups > 1 and groups == clients


def _cause(runs: list[RunMetrics]) -> str:
    """The knob values behind a collapse: the ones the runs chose (`auto`), else 'as set'."""
    chosen = sorted({
        f"{str(knob.get('key', '')).rsplit('.', 1)[-1]} {knob.get('chosen'):g} chosen by auto"
        for run in runs if isinstance(run.auto_knobs, dict) for knob in run.auto_knobs.get("knobs") or []
    })  # fmt: skip
    return "; ".join(chosen) if chosen else "its knobs as set"


def _pinned_elsewhere(runs: list[RunMetrics]) -> str:
    """'threshold 4; 2 of 3 seeds': the knobs the runs pinned for another data setting,
    with their values, and how many of the runs did ('' when none did)."""
    pinned = [run for run in runs if run.pinned_elsewhere]
    if not pinned:
        return ""
    knobs = sorted({
        f"{str(item.get('key', '')).rsplit('.', 1)[-1]} {_shown(item.get('value'))}" for run in pinned for item in run.pinned_elsewhere
    })  # fmt: skip
    return f"{', '.join(knobs)}; {len(pinned)} of {len(runs)} seed{'' if len(runs) == 1 else 's'}"


def _late_rise(runs: list[RunMetrics]) -> str:
    """'+3.7 pp in the last third' (or '-2.1 pp'): the row's mean late rise (hdcfl_ray/diagnostics/curve_trend.py)."""
    late = [v for v in (_value(r, "late_rise") for r in runs) if not math.isnan(v)]
    return f"{100 * mean(late):+.1f} pp in the last third"


def _shown(value: object) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def _value(record: RunMetrics, name: str) -> float:
    value = record.values.get(name, math.nan)
    return math.nan if value is None else float(value)


def _below(runs: list[RunMetrics], local: list[RunMetrics]) -> bool:
    own = [v for v in (_value(r, "mean_accuracy") for r in runs) if not math.isnan(v)]
    reference = [v for v in (_value(r, "mean_accuracy") for r in local) if not math.isnan(v)]
    if not own or not reference:
        return False
    spreads = [stdev(values) for values in (own, reference) if len(values) > 1]
    spread = max(spreads) if spreads else 0.0
    return mean(own) < mean(reference) - spread
