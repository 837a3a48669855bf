"""The report's tables (analysis/report_table.py says what a table holds) and their
renderings: Markdown, CSV, LaTeX, rich."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable

from hdcfl_ray.errors import ScenarioError

from analysis.auto_choice import chosen_by_note
from analysis.participation_split import DIFFERENCE, NON_PARTICIPANTS, PARTICIPANTS
from analysis.provenance import mark_across_machines, provenance_note
from analysis.report_table import BEST, REFERENCE, SECOND, ReportTable, Text, percent as _percent, with_std as _with_std
from analysis.trivial_rows import TABLE_METRICS as TRIVIAL_TABLES, macro_reference_rows, reference_note, reference_rows
from analysis.group_usage import HELD_SHARE
from analysis.verdict import RULE, paired_verdict
from analysis.row_flags import cell_flags, evidence_flags, flag_note, row_flags
from analysis.final_metrics import (
    METRICS,
    SCORED_ON_VALIDATION,
    RunMetrics,
    average_rank,
    PAIRED_GLOBAL,
    best_two,
    cells,
    complete_methods,
    macro_average,
    personalisation_gains,
    settings_and_methods,
    tail_rank,
    ranked_settings,
    unranked_settings,
    variant_base,
)

__all__ = ["ReportTable", "Text", "all_tables", "to_csv", "to_latex", "to_markdown", "to_rich"]

TITLES = {
    "mean_accuracy": "Mean client test accuracy (%), mean ± sample std over seeds (table 1 form)",
    "worst_accuracy": "Final worst-client test accuracy (%) (table 7 form)",
    "bottom20_accuracy": "Final bottom-20% client test accuracy (%) (table 8 form)",
    "gap": "Final best-minus-worst gap (pp; lower is better) (table 9 form)",
    "ari_true": "ARI of the final client groups against the planted groups (clustered methods)",
    "newcomer_mean_accuracy": (
        "Newcomers' mean test accuracy (%): clients held out of every round, scored by each method's newcomer rule "
        "(partition.newcomers; docs/newcomers.md)"
    ),
    "newcomer_worst_accuracy": "Newcomers' worst test accuracy (%)",
    "newcomer_ari_with_clients": "Newcomers placed with their planted group's clients: ARI of the newcomers and the trained clients together against the planted groups",
    "mean_accuracy_own_classes": (
        "Mean client test accuracy (%) with predictions restricted to each client's own training classes "
        "(encoder quality apart from the label prior)"
    ),
}


def per_setting_table(records: list[RunMetrics], metric: str, with_rank: bool, with_macro: bool) -> ReportTable:
    settings, methods = settings_and_methods(records)
    table = cells(records, metric)
    scale = 1.0 if metric in ("ari_true", "newcomer_ari_with_clients") else 100.0
    header = ["Method", *settings] + (["Avg. rank ↓"] if with_rank else []) + (["Macro"] if with_macro else [])
    result = ReportTable(TITLES[metric], header)
    marks = {s: best_two(table, s, methods, METRICS[metric]) for s in settings}
    ranks = average_rank(records, metric) if with_rank else {}
    macro = macro_average(records, metric) if with_macro else {}
    flags = row_flags(records)
    for method in methods:
        if all((s, method) not in table or math.isnan(table[(s, method)].mean) for s in settings):
            continue
        row = [Text(method)]
        for setting in settings:
            cell = table.get((setting, method))
            if cell is None or math.isnan(cell.mean):
                row.append(Text("-"))
                continue
            best, second = marks[setting]
            mark = BEST if method in best else SECOND if method in second else ""
            row.append(Text(_with_std(cell, scale), mark, tuple(cell_flags(flags.get((setting, method)), metric))))
        if with_rank:
            row.append(Text(_rank(ranks[method])))
        if with_macro:
            row.append(Text(_percent(macro[method], scale)))
        result.rows.append(row)
    result.rows += reference_rows(records, metric, settings, with_rank, with_macro)  # italic, below the methods, never ranked
    seeds = sorted({r.seed for r in records})
    notes = [f"{len(records)} runs; seeds {', '.join(map(str, seeds))}. Bold: best per setting; underlined: second best."]
    notes.append(_missing_note(records, metric) if (with_rank or with_macro) else "")
    notes.append(reference_note(records) if metric in TRIVIAL_TABLES else "")
    notes.append(flag_note(cell.flags for row in result.rows for cell in row))
    result.note = " ".join(note for note in notes if note)
    return result


NEWCOMER_METRICS = ("newcomer_mean_accuracy", "newcomer_worst_accuracy")


def newcomer_tables(records: list[RunMetrics]) -> list[ReportTable]:
    """The newcomers' accuracy tables and the placement ARI table, where runs held
    newcomers out (partition.newcomers); each names the methods that scored none because
    they have no newcomer rule, rather than leave them out unsaid."""
    with_newcomers = [r for r in records if not math.isnan(r.values.get("newcomer_mean_accuracy", math.nan))]
    if not with_newcomers:
        return []
    settings = {r.setting for r in with_newcomers}
    scored = {r.method for r in with_newcomers}
    unruled = sorted({r.method for r in records if r.setting in settings and r.method not in scored})
    tables = [per_setting_table(records, metric, with_rank=False, with_macro=False) for metric in NEWCOMER_METRICS]
    if unruled:
        for table in tables:
            table.note = f"{table.note} No newcomer rule, so no newcomer row: {', '.join(unruled)}.".strip()
    if any(not math.isnan(r.values.get("newcomer_ari_with_clients", math.nan)) for r in records):
        tables.append(per_setting_table(records, "newcomer_ari_with_clients", with_rank=False, with_macro=False))
    return tables


def _rank(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def _missing_note(records: list[RunMetrics], metric: str) -> str:
    """Which columns ranks and macro values leave out, which methods have none, and why."""
    notes = []
    variants = unranked_settings(records)
    if variants:
        notes.append(
            "Ranks and macro values leave out the variant columns of a setting here (replays, calibration values): "
            + ", ".join(variants) + "."
        )
    _, missing = complete_methods(records, metric)
    if missing:
        settings = ranked_settings(records)
        table = cells(records, metric)
        named = [f"{m} (no {', '.join(s for s in settings if (s, m) not in table or math.isnan(table[(s, m)].mean))})" for m in missing]
        notes.append("Ranks and macro values compare only methods run in every setting; without them: " + "; ".join(named) + ".")
    return " ".join(notes)


def macro_table(records: list[RunMetrics]) -> ReportTable:
    _, methods = settings_and_methods(records)
    columns = [("Mean", "mean_accuracy"), ("Worst", "worst_accuracy"), ("Bot.20%", "bottom20_accuracy"), ("Gap", "gap")]
    averages = {metric: macro_average(records, metric) for _, metric in columns}
    tails = tail_rank(records)
    result = ReportTable("Client-level results macro-averaged over settings (table 2 form)", ["Method", *[c for c, _ in columns], "Tail rank ↓"])
    settings = ranked_settings(records)  # the settings the averages are over
    flags = row_flags(records)
    for method in methods:
        # what the averages rest on: the settings where the method has fewer seeds or a sampled evaluation
        behind = tuple(f"{flag} in {setting}" for setting in settings for flag in evidence_flags(flags.get((setting, method))))
        result.rows.append(
            [Text(method, flags=behind), *[Text(_percent(averages[m][method], 100.0)) for _, m in columns], Text(_rank(tails[method]))]
        )
    result.rows += macro_reference_rows(records, [metric for _, metric in columns])
    result.note = " ".join(
        note
        for note in (
            "Tail rank: each method's rank in worst, bottom-20% and gap, averaged over those three and over settings.",
            _missing_note(records, "mean_accuracy"),
            reference_note(records),
            flag_note(row[0].flags for row in result.rows),
        )
        if note
    )
    return result


def variant_tables(records: list[RunMetrics]) -> list[ReportTable]:
    """Tables 3 and 10-13 form: for each base setting that has variants (settings named
    `<base>.<variant>`, as `hdcfl-ray ablate` writes them), one row per variant of
    HDC-FL and columns Mean, Worst, Bottom-20%, and table 10's silhouette and
    refresh-to-refresh ARI where the runs logged refreshes."""
    tables = []
    settings = sorted({r.setting for r in records})
    bases = sorted({variant_base(s) for s in settings if variant_base(s) != s})
    accuracy = (("Mean", "mean_accuracy"), ("Worst", "worst_accuracy"), ("Bot.20%", "bottom20_accuracy"))
    diagnostics = (("Sil.", "refresh_silhouette"), ("Refresh ARI", "refresh_ari_previous"))
    by_seed = {(r.setting, r.method, r.seed): r.values.get("mean_accuracy", math.nan) for r in records}
    made_by = {(r.setting, r.method, r.seed): r.provenance for r in records}
    for base in bases:
        members = [s for s in settings if variant_base(s) == base]
        logged = [name for name, metric in diagnostics
                  if any(not math.isnan(r.values.get(metric, math.nan)) for r in records if r.setting in members)]
        columns = accuracy + tuple((name, metric) for name, metric in diagnostics if name in logged)
        table = ReportTable(
            f"{base}: server-side variants (tables 3, 10-13 form)",
            ["Variant", "Method", *[name for name, _ in columns], "Mean minus as run (per seed)", "Verdict vs as run"],
        )
        per_metric = {metric: cells(records, metric) for _, metric in columns}
        flags = row_flags(records)
        for setting in members:
            variant = "as run" if setting == base else setting.split(" ", 1)[0].split(".", 1)[1]
            for method in sorted({r.method for r in records if r.setting == setting}):
                row = [Text(variant), Text(method, flags=tuple(evidence_flags(flags.get((setting, method)))))]
                for _, metric in columns:
                    cell = per_metric[metric][(setting, method)]
                    scale = 100.0 if metric in dict(accuracy).values() else 1.0
                    row.append(Text("-" if math.isnan(cell.mean) else _with_std(cell, scale)))
                seeds = sorted(seed for (s, m, seed) in by_seed if (s, m) == (setting, method) and (base, m, seed) in by_seed)
                diffs = [100.0 * (by_seed[(setting, method, seed)] - by_seed[(base, method, seed)]) for seed in seeds]
                if setting == base or not diffs:
                    row += [Text("-"), Text("-")]
                else:
                    pairs = [(made_by[(setting, method, seed)], made_by[(base, method, seed)]) for seed in seeds]
                    row += [Text(" / ".join(f"{diff:+.2f}" for diff in diffs)), Text(mark_across_machines(paired_verdict(diffs), pairs))]
                table.rows.append(row)
        table.note = (
            "Variants are replays of the same runs' refreshes (hdcfl-ray ablate), so rows are paired by seed: the "
            f"mean accuracy minus the run's own, seed by seed in seed order, and its verdict ({RULE})."
        )
        if logged:
            table.note += (" Sil.: silhouette of each refresh's grouping in descriptor space; Refresh ARI: agreement "
                           "of consecutive refreshes' groups (1 = unchanged); each averaged over the run's refreshes, "
                           "then mean ± std over seeds.")
        marks = flag_note(row[1].flags for row in table.rows)
        table.note += f" {marks}" if marks else ""
        tables.append(table)
    return tables


def gain_table(records: list[RunMetrics]) -> ReportTable | None:
    """Where the mixture pays: each HDC-FL setting's personalised score beside the same
    run's global encoder (with each client's own head), paired by seed."""
    table = _gain_rows(
        [record for record in records if record.method == "hdcfl"],
        "HDC-FL: gain of the prototype mixture over the same run's global encoder with each client's own head (pp)",
        "Global-encoder mean",
        with_method=False,
        flags=row_flags(records),
    )
    if table is not None:
        table.note = " ".join(note for note in (
            "Both scores come from the same runs and the same final evaluation, so the gain is paired per seed (mean ± "
            "sample std of the differences). The global encoder is trained exactly as FedAvg-SE trains it, so with the "
            "same seeds the gain is also HDC-FL minus FedAvg-SE.", table.note) if note)  # fmt: skip
    return table


def shared_model_gain_table(records: list[RunMetrics]) -> ReportTable | None:
    """Every other method that logs, beside its headline score, the score of its shared
    model before personalisation: what the personalisation step adds, paired by seed."""
    table = _gain_rows(
        [record for record in records if record.method != "hdcfl"],
        "Personalisation step: each method's final score minus its own shared model's, from the same evaluation (pp)",
        "Shared-model mean",
        with_method=True,
        flags=row_flags(records),
    )
    if table is not None:
        table.note = " ".join(note for note in (
            "The shared-model score is the one each method logs as `accuracy_global` in its clients table: the model it "
            "shares before its personalisation step (docs/logs.md says which model each method logs there, e.g. FedBABU's "
            "body under its fixed head before fine-tuning). Paired per seed: mean ± sample std of the differences.",
            table.note,
        ) if note)  # fmt: skip
    return table


def _gain_rows(
    records: list[RunMetrics], title: str, global_label: str, with_method: bool, flags: dict[tuple[str, str], list[str]]
) -> ReportTable | None:
    """`flags`: the report's row flags (analysis/row_flags.py), of which each row carries its evidence flags."""
    per_metric = {metric: personalisation_gains(records, metric) for metric, _ in PAIRED_GLOBAL}
    keys = sorted(per_metric["mean_accuracy"])
    if not keys:
        return None
    table = ReportTable(
        title,
        ["Setting", *(["Method"] if with_method else []), "Personalised mean", global_label, "Gain: mean", "Gain: worst",
         "Gain: bot.20%", "Seeds with mean gain > 0"],
    )
    for setting, method in keys:
        behind = tuple(evidence_flags(flags.get((setting, method))))  # on the cell that names the row
        row = [Text(setting, flags=() if with_method else behind), *([Text(method, flags=behind)] if with_method else [])]
        mean_gain = per_metric["mean_accuracy"][(setting, method)]
        row += [Text(_with_std(mean_gain.personalised)), Text(_with_std(mean_gain.global_encoder))]
        for metric, _ in PAIRED_GLOBAL:
            gain = per_metric[metric].get((setting, method))
            row.append(Text("-" if gain is None else _with_std(gain.gain, signed=True)))
        row.append(Text(f"{mean_gain.seeds_helped} of {mean_gain.gain.seeds}"))
        table.rows.append(row)
    table.note = flag_note(cell.flags for row in table.rows for cell in row[:2])
    return table


def _never_held(record: RunMetrics) -> str:
    never, available = record.values.get("groups_never_held", math.nan), record.values.get("groups_available", math.nan)
    return "-" if math.isnan(never) or math.isnan(available) else f"{int(never)} of {int(available)}"


def clustered_table(records: list[RunMetrics]) -> ReportTable | None:
    """Every method that forms client groups: the groups it ended with and their ARI
    against the planted groups beside its accuracy, so a method that found one cluster
    (or the wrong ones) is seen next to the score it explains."""
    grouped = [r for r in records if not math.isnan(r.values.get("num_groups", math.nan))]
    if not grouped:
        return None
    table = ReportTable(
        "Clustered methods: groups found at the final evaluation and their ARI against the planted groups, beside the mean accuracy",
        ["Setting", "Method", "Mean acc.", "Groups found (per seed)", "Never held a client (per seed)", "ARI vs planted", "Flags"],
    )
    flags = row_flags(records)
    accuracy, ari = cells(grouped, "mean_accuracy"), cells(grouped, "ari_true")
    for setting, method in sorted({(r.setting, r.method) for r in grouped}):
        runs = sorted((r for r in grouped if (r.setting, r.method) == (setting, method)), key=lambda r: r.seed)
        found = ", ".join(str(int(r.values["num_groups"])) for r in runs)
        never = ", ".join(_never_held(r) for r in runs)
        ari_cell = ari.get((setting, method))
        ari_text = "-" if ari_cell is None or math.isnan(ari_cell.mean) else _with_std(ari_cell, scale=1.0)
        row_flag = "; ".join(flags.get((setting, method), [])) or "-"
        table.rows.append(
            [Text(setting), Text(method), Text(_with_std(accuracy[(setting, method)])), Text(found), Text(never), Text(ari_text),
             Text(row_flag)]  # fmt: skip
        )
    table.note = " ".join(
        note
        for note in (
            "Groups: distinct groups among the clients' final assignments (argmax membership for soft methods); ARI 1 = the "
            "planted groups exactly, 0 = chance. Never held a client: of the groups the run had, those that at no evaluated "
            f"round were a client's assigned group or carried over {100 * HELD_SHARE:g}% of its membership (such a group "
            "trained on next to nothing: analysis/group_usage.py); - where the run logs no group count.",
            flag_note(flags.get((r.setting, r.method), []) for r in grouped),
        )
        if note
    )
    return table


def grouping_diagnostics_table(records: list[RunMetrics]) -> ReportTable | None:
    """How well defined and how stable the groups are, read off the runs alone: what there
    is to say about a grouping where no groups were planted (natural clients)."""
    columns = (("refresh_silhouette", 1.0), ("refresh_ari_previous", 1.0), ("membership_entropy", 1.0))
    grouped = [
        r for r in records
        if not math.isnan(r.values.get("num_groups", math.nan)) and any(not math.isnan(r.values.get(c, math.nan)) for c, _ in columns)
    ]  # fmt: skip
    if not grouped:
        return None
    table = ReportTable(
        "Clustered methods: how defined and how stable the groups are (silhouette, refresh ARI, membership entropy)",
        ["Setting", "Method", "Groups found (per seed)", "Silhouette", "Refresh ARI", "Membership entropy"],
    )
    per_column = {column: cells(grouped, column) for column, _ in columns}
    for setting, method in sorted({(r.setting, r.method) for r in grouped}):
        runs = sorted((r for r in grouped if (r.setting, r.method) == (setting, method)), key=lambda r: r.seed)
        row = [Text(setting), Text(method), Text(", ".join(str(int(r.values["num_groups"])) for r in runs))]
        for column, scale in columns:
            cell = per_column[column].get((setting, method))
            row.append(Text("-" if cell is None or math.isnan(cell.mean) else _with_std(cell, scale=scale)))
        table.rows.append(row)
    table.note = (
        "Silhouette: of each refresh's grouping in the space the method groups in (HDC-FL: its head descriptors), "
        "1 = tight, well separated groups, 0 = none; Refresh ARI: agreement of consecutive refreshes' groups, 1 = "
        "unchanged (stability); both averaged over the run's refreshes. Membership entropy: mean over clients of "
        "H(m) / log G at the final evaluation, 0 = each client in one group, 1 = uniform (soft methods). Mean ± sample "
        "std over seeds; - where a method logs no such value."
    )
    return table


def participation_table(records: list[RunMetrics]) -> ReportTable | None:
    """Under partial participation: the final round's accuracy of the clients that trained
    in it beside that of the clients that sat it out, and their difference paired by seed.
    A shared model scored on clients that did not train it shows a wide difference."""
    split = [r for r in records if not math.isnan(r.values.get(DIFFERENCE, math.nan))]
    if not split:
        return None
    table = ReportTable(
        "Final-round accuracy (%) of the clients that trained in the final round and of those that sat it out (partial participation)",
        ["Setting", "Method", "Trained in the final round", "Sat it out", "Difference (pp)"],
    )
    trained, rest, difference = cells(split, PARTICIPANTS), cells(split, NON_PARTICIPANTS), cells(split, DIFFERENCE)
    flags = row_flags(records)
    for key in sorted(trained):
        behind = tuple(evidence_flags(flags.get(key)))
        table.rows.append(
            [Text(key[0]), Text(key[1], flags=behind), Text(_with_std(trained[key])), Text(_with_std(rest[key])), Text(_with_std(difference[key], signed=True))]
        )
    table.note = (
        "Each side is the mean over its clients at the final evaluation, then mean ± sample std over seeds; the difference "
        "is taken per seed. Clients scored with a private head keep it fitted to their own classes; clients scored with a "
        "shared model (a cluster model, a global head) that sat the round out get it as that round's participants left it."
    )
    table.note = " ".join(note for note in (table.note, flag_note(row[1].flags for row in table.rows)) if note)
    return table


def budget_table(records: list[RunMetrics]) -> ReportTable | None:
    """Local training work per method, counted by the runtime: a method that trains more
    clients, more models or extra epochs shows it here beside its accuracy."""
    budgeted = [r for r in records if not math.isnan(r.values.get("samples_trained", math.nan))]
    if not budgeted:
        return None
    table = ReportTable(
        "Training budget: samples through local training and local optimiser steps (mean over seeds)",
        ["Setting", "Method", "Samples / round", "Steps / round", "Total samples", "Total steps", "Of which while evaluating"],
    )
    columns = ("samples_trained", "local_steps", "eval_samples_trained", "eval_local_steps")
    for setting, method in sorted({(r.setting, r.method) for r in budgeted}):
        runs = [r for r in budgeted if (r.setting, r.method) == (setting, method)]
        means = {c: sum(r.values[c] for r in runs) / len(runs) for c in columns}
        rounds = sum(r.values["rounds"] for r in runs) / len(runs)
        total_samples = means["samples_trained"] + means["eval_samples_trained"]
        total_steps = means["local_steps"] + means["eval_local_steps"]
        table.rows.append(
            [
                Text(setting),
                Text(method),
                Text(f"{means['samples_trained'] / rounds:,.0f}"),
                Text(f"{means['local_steps'] / rounds:,.0f}"),
                Text(f"{total_samples:,.0f}"),
                Text(f"{total_steps:,.0f}"),
                Text(f"{means['eval_samples_trained']:,.0f} samples, {means['eval_local_steps']:,.0f} steps"),
            ]
        )
    table.note = (
        "Counted by the runtime around every local training call: training-round updates (rejected ones included) and "
        "training done while evaluating (FedBABU's fine-tuning, FedALA's weight learning). Forward-only passes "
        "(cluster assignment, importance estimation, evaluation) are not training and are not counted."
    )
    return table


def all_tables(records: list[RunMetrics], against: str | None = None, left_out: str = "") -> list[ReportTable]:
    """Every report table; the paired table takes `against` (default hdcfl) minus each
    other method. A named `against` that no test-scored record holds is bad input
    (ScenarioError). Validation-scored runs (analysis/validation_table.py) are kept out of
    every test table, rank and macro value and listed in a table of their own.
    `left_out` (analysis.runs.left_out_note) names the unfinished runs in every table's note."""
    from analysis.auto_knobs_table import auto_knobs_table  # these build on this module's tables
    from analysis.communication import communication_table
    from analysis.curve_peaks import peak_table
    from analysis.paired_table import paired_table
    from analysis.validation_table import validation_table

    validated = [record for record in records if record.scored_on == SCORED_ON_VALIDATION]
    tested = [record for record in records if record.scored_on != SCORED_ON_VALIDATION]
    methods = sorted({record.method for record in tested})
    if against is not None and against not in methods:
        only_validated = " (its runs here are all validation-scored, which are not compared)" if any(
            record.method == against for record in validated) else ""  # fmt: skip
        raise ScenarioError(
            f"--against {against!r}: no completed test-scored run of that method here{only_validated}; "
            f"the test-scored runs hold {', '.join(methods) or 'no method'}"
        )
    every: list[ReportTable] = []
    if tested:
        every = [
            per_setting_table(tested, "mean_accuracy", with_rank=True, with_macro=False),
            per_setting_table(tested, "worst_accuracy", with_rank=False, with_macro=True),
            per_setting_table(tested, "bottom20_accuracy", with_rank=False, with_macro=True),
            per_setting_table(tested, "gap", with_rank=False, with_macro=True),
            macro_table(tested),
        ]
        if any(not math.isnan(r.values.get("mean_accuracy_own_classes", math.nan)) for r in tested):
            every.append(per_setting_table(tested, "mean_accuracy_own_classes", with_rank=False, with_macro=False))
        if any(not math.isnan(r.values.get("ari_true", math.nan)) for r in tested):
            every.append(per_setting_table(tested, "ari_true", with_rank=False, with_macro=False))
        every += newcomer_tables(tested)
        optional = (
            peak_table(tested), clustered_table(tested), grouping_diagnostics_table(tested), participation_table(tested), budget_table(tested),
            gain_table(tested),
            shared_model_gain_table(tested), paired_table(tested, against or "hdcfl"), communication_table(tested),
            auto_knobs_table(tested),
        )  # fmt: skip
        every += [table for table in optional if table is not None] + variant_tables(tested)
    validation = validation_table(validated)
    for tables, behind in ((every, tested), ([validation] if validation else [], validated)):
        source = provenance_note(record.provenance for record in behind if record.provenance)
        chosen = chosen_by_note((record.method, record.auto_knobs) for record in behind)
        for table in tables:  # a table copied on its own still says what produced it and what it lacks
            table.note = " ".join(note for note in (table.note, chosen, left_out, source) if note)
    return every + ([validation] if validation else [])


# ---- renderings ----
def to_markdown(tables: list[ReportTable]) -> str:
    blocks = []
    for table in tables:
        lines = [f"### {table.title}", "", "| " + " | ".join(table.header) + " |", "|" + "---|" * len(table.header)]
        for row in table.rows:
            lines.append("| " + " | ".join(_markdown_cell(cell) for cell in row) + " |")
        if table.note:
            lines += ["", table.note]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def _markdown_cell(cell: Text) -> str:
    if cell.mark == BEST:
        return f"**{cell.shown}**"
    if cell.mark == SECOND:
        return f"<u>{cell.shown}</u>"
    if cell.mark == REFERENCE:
        return f"*{cell.shown}*"
    return cell.shown


def to_latex(tables: list[ReportTable]) -> str:
    blocks = []
    for table in tables:
        lines = [
            "\\begin{table}[t]",
            "\\centering",
            f"\\caption{{{_latex_escape(table.title)}}}",
            "\\begin{tabular}{l" + "c" * (len(table.header) - 1) + "}",
            "\\toprule",
            " & ".join(_latex_escape(h) for h in table.header) + " \\\\",
            "\\midrule",
        ]
        for row in table.rows:
            lines.append(" & ".join(_latex_cell(cell) for cell in row) + " \\\\")
        lines += ["\\bottomrule", "\\end{tabular}"]
        if table.note:  # flags' rules and provenance travel with the table
            lines += ["", "\\par\\footnotesize " + _latex_escape(table.note)]
        lines += ["\\end{table}"]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def _latex_escape(text: str) -> str:
    return (
        text.replace("\\", "\\textbackslash{}").replace("%", "\\%").replace("_", "\\_").replace("&", "\\&")
        .replace("±", "$\\pm$").replace("↓", "$\\downarrow$")
    )


def _latex_cell(cell: Text) -> str:
    text = _latex_escape(cell.shown)
    if cell.mark == BEST:
        return f"\\textbf{{{text}}}"
    if cell.mark == SECOND:
        return f"\\underline{{{text}}}"
    if cell.mark == REFERENCE:
        return f"\\textit{{{text}}}"
    return text


# The columns CSV adds to every table, so that what Markdown shows by bold, underline and
# brackets survives as data: the columns where the row is best or second best, and each
# flagged cell's column with its flags.
CSV_MARK_COLUMNS = ["Best in", "Second best in", "Flagged cells"]


def to_csv(tables: list[ReportTable]) -> str:
    """Each table: its title, header and rows (plain values) with the three CSV_MARK_COLUMNS
    (column names joined by " | "; a flagged cell as "column: flag; flag"), then its note."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    for table in tables:
        writer.writerow([f"# {table.title}"])
        writer.writerow([*table.header, *CSV_MARK_COLUMNS])
        for row in table.rows:
            columns = list(zip(table.header, row))
            best = " | ".join(name for name, cell in columns if cell.mark == BEST)
            second = " | ".join(name for name, cell in columns if cell.mark == SECOND)
            flagged = " | ".join(f"{name}: {'; '.join(cell.flags)}" for name, cell in columns if cell.flags)
            writer.writerow([*(cell.value for cell in row), best, second, flagged])
        if table.note:
            writer.writerow([f"# {table.note}"])
        writer.writerow([])
    return buffer.getvalue()


def to_rich(tables: list[ReportTable]) -> list:
    from rich.markup import escape
    from rich.table import Table

    # Escaped: square brackets are rich markup, and reports write them ("[below Local]",
    # "quickstart [partition.k=3]", "hdcfl [mix=0.0]"), which would vanish unescaped.
    rendered = []
    for table in tables:
        rich_table = Table(title=escape(table.title), caption=escape(table.note) if table.note else None)
        for column in table.header:
            rich_table.add_column(escape(column), justify="left" if column == "Method" else "right")
        for row in table.rows:
            rich_table.add_row(*[_rich_cell(cell, escape) for cell in row])
        rendered.append(rich_table)
    return rendered


_RICH_STYLES = {BEST: "bold", SECOND: "underline", REFERENCE: "italic"}


def _rich_cell(cell: Text, escape: Callable[[str], str]) -> str:
    style = _RICH_STYLES.get(cell.mark)
    return f"[{style}]{escape(cell.shown)}[/]" if style else escape(cell.shown)
