"""The trivial reference rows of the main results tables and the flag on a method that
does not beat them.

Every run records what trivial predictors score on exactly the samples its clients are
scored on (analysis/trivial_record.py). All runs of one setting and seed score the same
clients on the same samples, so a setting's reference cell is, like a method's, the mean
± sample std over seeds of one run per seed. Reference rows are shown in italics below
the methods and take no part in anything that compares methods: no best or second-best
mark, no rank, no paired verdict. A method whose mean accuracy is not above the best
reference of its setting by more than the seed spread is flagged (TRIVIAL_FLAG)."""

from __future__ import annotations

import math
from statistics import mean, stdev

from hdcfl_ray.diagnostics.trivial_reference import REFERENCE_NAMES

from analysis.final_metrics import Cell, RunMetrics, cells, ranked_settings
from analysis.report_table import REFERENCE, Text, percent, with_std

PREFIX = "reference: "
# the tables that carry reference rows: the metrics every reference records
TABLE_METRICS = ("mean_accuracy", "worst_accuracy", "bottom20_accuracy", "gap")
TRIVIAL_FLAG = "trivial"
TRIVIAL_RULE = (
    "not above the trivial reference: the final mean accuracy is not above the best trivial reference of its setting "
    "(the italic reference rows) by more than the larger of the two seed stds (with one seed: not above at all); "
    "that reference and its mean in brackets"
)
NOT_RECORDED = "no trivial reference recorded (runs older than the manifest's trivial_references record)"


def reference_records(records: list[RunMetrics]) -> list[RunMetrics]:
    """One record per setting, seed and reference (its row label as the method): the
    references of the first run of that setting and seed that recorded them."""
    chosen: dict[tuple[str, int], RunMetrics] = {}
    for record in sorted(records, key=lambda r: (r.setting, r.seed, r.method)):
        if record.trivial_references and (record.setting, record.seed) not in chosen:
            chosen[(record.setting, record.seed)] = record
    return [
        RunMetrics(setting, PREFIX + name, seed, dict(values))
        for (setting, seed), record in chosen.items()
        for name, values in (record.trivial_references or {}).items()
    ]


def reference_names(records: list[RunMetrics]) -> list[str]:
    """The references some run recorded, in the order of REFERENCE_NAMES (others after)."""
    names = {name for record in records for name in record.trivial_references or {}}
    return [name for name in REFERENCE_NAMES if name in names] + sorted(names - set(REFERENCE_NAMES))


def reference_rows(records: list[RunMetrics], metric: str, settings: list[str], with_rank: bool, with_macro: bool) -> list[list[Text]]:
    """The italic reference rows of a per-setting table of `metric` ([] for a metric the
    references do not record): '-' for a rank, the macro value over the ranked settings
    where the reference has every one of them."""
    if metric not in TABLE_METRICS:
        return []
    table = cells(reference_records(records), metric)
    ranked = ranked_settings(records)
    rows = []
    for name in reference_names(records):
        label = PREFIX + name
        row = [Text(label, REFERENCE)]
        row += [Text(_shown(table.get((setting, label))), REFERENCE) for setting in settings]
        if with_rank:
            row.append(Text("-", REFERENCE))
        if with_macro:
            row.append(Text(percent(_macro(table, label, ranked)), REFERENCE))
        rows.append(row)
    return rows


def macro_reference_rows(records: list[RunMetrics], metrics: list[str]) -> list[list[Text]]:
    """The reference rows of the table of macro averages: one column per metric, then a '-' tail rank."""
    tables = {metric: cells(reference_records(records), metric) for metric in metrics}
    ranked = ranked_settings(records)
    return [
        [Text(PREFIX + name, REFERENCE), *(Text(percent(_macro(tables[m], PREFIX + name, ranked)), REFERENCE) for m in metrics), Text("-", REFERENCE)]
        for name in reference_names(records)
    ]


def reference_note(records: list[RunMetrics]) -> str:
    """What the reference rows are, and the settings whose runs recorded none (said once)."""
    notes = []
    if reference_names(records):
        notes.append(
            "Italic rows 'reference: ...' are trivial references scored on the same clients' samples as the methods "
            "(docs/results.md): majority class (pooled) predicts the most frequent class of the pooled training labels, "
            "(own) each client's own; pooled and own n-gram (text) predict the next character from the window's last "
            "characters, counted on the pooled or the client's own training windows. They are not ranked, never marked "
            "best, and left out of ranks and paired verdicts."
        )
    recorded = {record.setting for record in records if record.trivial_references}
    missing = sorted({record.setting for record in records} - recorded)
    if missing:
        where = f" in {', '.join(missing)}" if recorded else ""
        notes.append(f"{NOT_RECORDED[0].upper()}{NOT_RECORDED[1:]}{where}.")
    return " ".join(notes)


def trivial_flags(records: list[RunMetrics]) -> dict[tuple[str, str], str]:
    """(setting, method) -> the flag of a method not above its setting's best reference
    by more than the seed spread (TRIVIAL_RULE)."""
    references = cells(reference_records(records), "mean_accuracy")
    best: dict[str, tuple[str, Cell]] = {}
    for (setting, label), cell in sorted(references.items()):
        if not math.isnan(cell.mean) and (setting not in best or cell.mean > best[setting][1].mean):
            best[setting] = (label[len(PREFIX):], cell)
    grouped: dict[tuple[str, str], list[float]] = {}
    for record in records:
        value = record.values.get("mean_accuracy", math.nan)
        if record.setting in best and value is not None and not math.isnan(value):
            grouped.setdefault((record.setting, record.method), []).append(float(value))
    flags = {}
    for (setting, method), own in grouped.items():
        name, reference = best[setting]
        spreads = [stdev(own)] if len(own) > 1 else []
        spreads += [] if math.isnan(reference.std) else [reference.std]
        if mean(own) - reference.mean <= max(spreads, default=0.0):
            flags[(setting, method)] = f"{TRIVIAL_FLAG} ({name} {100 * reference.mean:.2f})"
    return flags


def _shown(cell: Cell | None) -> str:
    return "-" if cell is None or math.isnan(cell.mean) else with_std(cell)


def _macro(table: dict[tuple[str, str], Cell], label: str, settings: list[str]) -> float:
    values = [table[(setting, label)].mean for setting in settings if (setting, label) in table]
    if not settings or len(values) < len(settings) or any(math.isnan(value) for value in values):
        return math.nan
    return mean(values)
