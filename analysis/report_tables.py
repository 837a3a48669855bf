"""The report's tables as plain data (header, rows of cells with best/second marks)
and their renderings: Markdown, CSV, LaTeX, rich."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field

from hdcfl_ray.errors import ScenarioError

from analysis.participation_split import DIFFERENCE, NON_PARTICIPANTS, PARTICIPANTS
from analysis.provenance import mark_across_machines, provenance_note
from analysis.verdict import RULE, paired_verdict
from analysis.row_flags import flag_note, flagged, row_flags
from analysis.final_metrics import (
    METRICS,
    Cell,
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
)

TITLES = {
    "mean_accuracy": "Mean client test accuracy (%), mean ± sample std over seeds (table 1 form)",
    "worst_accuracy": "Final worst-client test accuracy (%) (table 7 form)",
    "bottom20_accuracy": "Final bottom-20% client test accuracy (%) (table 8 form)",
    "gap": "Final best-minus-worst gap (pp; lower is better) (table 9 form)",
    "ari_true": "ARI of the final client groups against the planted groups (clustered methods)",
    "mean_accuracy_own_classes": (
        "Mean client test accuracy (%) with predictions restricted to each client's own training classes "
        "(encoder quality apart from the label prior)"
    ),
}


@dataclass
class Text:
    value: str
    mark: str = ""  # "best" | "second" | ""


@dataclass
class ReportTable:
    title: str
    header: list[str]
    rows: list[list[Text]] = field(default_factory=list)
    note: str = ""


def _percent(value: float, scale: float) -> str:
    return "-" if math.isnan(value) else f"{scale * value:.2f}"


def _with_std(cell: Cell, scale: float = 100.0, signed: bool = False) -> str:
    """"mean ± std" (the std left out for one seed); `signed` marks differences with + or -."""
    text = f"{scale * cell.mean:+.2f}" if signed else _percent(cell.mean, scale)
    return text if math.isnan(cell.std) else f"{text} ± {_percent(cell.std, scale)}"


def per_setting_table(records: list[RunMetrics], metric: str, with_rank: bool, with_macro: bool) -> ReportTable:
    settings, methods = settings_and_methods(records)
    table = cells(records, metric)
    scale = 1.0 if metric == "ari_true" else 100.0
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
            text = flagged(_with_std(cell, scale), flags.get((setting, method)))
            best, second = marks[setting]
            row.append(Text(text, "best" if method in best else "second" if method in second else ""))
        if with_rank:
            row.append(Text(_rank(ranks[method])))
        if with_macro:
            row.append(Text(_percent(macro[method], scale)))
        result.rows.append(row)
    seeds = sorted({r.seed for r in records})
    notes = [f"{len(records)} runs; seeds {', '.join(map(str, seeds))}. Bold: best per setting; underlined: second best."]
    notes.append(_missing_note(records, metric) if (with_rank or with_macro) else "")
    notes.append(flag_note({key: found for key, found in flags.items() if key[1] in methods}))
    result.note = " ".join(note for note in notes if note)
    return result


def _rank(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def _missing_note(records: list[RunMetrics], metric: str) -> str:
    """Which methods have no rank or macro value, and why."""
    _, missing = complete_methods(records, metric)
    if not missing:
        return ""
    settings, _ = settings_and_methods(records)
    table = cells(records, metric)
    named = [f"{m} (no {', '.join(s for s in settings if (s, m) not in table or math.isnan(table[(s, m)].mean))})" for m in missing]
    return (
        "Ranks and macro values compare only methods run in every setting; without them: " + "; ".join(named) + "."
    )


def macro_table(records: list[RunMetrics]) -> ReportTable:
    _, methods = settings_and_methods(records)
    columns = [("Mean", "mean_accuracy"), ("Worst", "worst_accuracy"), ("Bot.20%", "bottom20_accuracy"), ("Gap", "gap")]
    averages = {metric: macro_average(records, metric) for _, metric in columns}
    tails = tail_rank(records)
    result = ReportTable("Client-level results macro-averaged over settings (table 2 form)", ["Method", *[c for c, _ in columns], "Tail rank ↓"])
    for method in methods:
        result.rows.append([Text(method), *[Text(_percent(averages[m][method], 100.0)) for _, m in columns], Text(_rank(tails[method]))])
    result.note = " ".join(
        note
        for note in (
            "Tail rank: each method's rank in worst, bottom-20% and gap, averaged over those three and over settings.",
            _missing_note(records, "mean_accuracy"),
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
    bases = sorted({_ablation_base(s) for s in settings if _ablation_base(s) != s})
    accuracy = (("Mean", "mean_accuracy"), ("Worst", "worst_accuracy"), ("Bot.20%", "bottom20_accuracy"))
    diagnostics = (("Sil.", "refresh_silhouette"), ("Refresh ARI", "refresh_ari_previous"))
    by_seed = {(r.setting, r.method, r.seed): r.values.get("mean_accuracy", math.nan) for r in records}
    made_by = {(r.setting, r.method, r.seed): r.provenance for r in records}
    for base in bases:
        members = [s for s in settings if _ablation_base(s) == base]
        logged = [name for name, metric in diagnostics
                  if any(not math.isnan(r.values.get(metric, math.nan)) for r in records if r.setting in members)]
        columns = accuracy + tuple((name, metric) for name, metric in diagnostics if name in logged)
        table = ReportTable(
            f"{base}: server-side variants (tables 3, 10-13 form)",
            ["Variant", "Method", *[name for name, _ in columns], "Mean minus as run (per seed)", "Verdict vs as run"],
        )
        per_metric = {metric: cells(records, metric) for _, metric in columns}
        for setting in members:
            variant = "as run" if setting == base else setting.split(" ", 1)[0].split(".", 1)[1]
            for method in sorted({r.method for r in records if r.setting == setting}):
                row = [Text(variant), Text(method)]
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
        tables.append(table)
    return tables


def _ablation_base(setting: str) -> str:
    """The setting a replay's column belongs to: its scenario's name up to the first dot
    (`hdcfl-ray ablate` names a replay `<base>.<variant>`), followed by what the column's
    name adds after the scenario name (` (validation)`, ` [key=value, ...]`, whose
    values may hold dots themselves); a column that is no replay is its own base."""
    name, space, rest = setting.partition(" ")
    return name.split(".", 1)[0] + space + rest


def gain_table(records: list[RunMetrics]) -> ReportTable | None:
    """Where the mixture pays: each HDC-FL setting's personalised score beside the same
    run's global encoder (with each client's own head), paired by seed."""
    table = _gain_rows(
        [record for record in records if record.method == "hdcfl"],
        "HDC-FL: gain of the prototype mixture over the same run's global encoder with each client's own head (pp)",
        "Global-encoder mean",
        with_method=False,
    )
    if table is not None:
        table.note = "Both scores come from the same runs and the same final evaluation, so the gain is paired per seed (mean ± sample std of the differences). The global encoder is trained exactly as FedAvg-SE trains it, so with the same seeds the gain is also HDC-FL minus FedAvg-SE."
    return table


def shared_model_gain_table(records: list[RunMetrics]) -> ReportTable | None:
    """Every other method that logs, beside its headline score, the score of its shared
    model before personalisation: what the personalisation step adds, paired by seed."""
    table = _gain_rows(
        [record for record in records if record.method != "hdcfl"],
        "Personalisation step: each method's final score minus its own shared model's, from the same evaluation (pp)",
        "Shared-model mean",
        with_method=True,
    )
    if table is not None:
        table.note = (
            "The shared-model score is the one each method logs as `accuracy_global` in its clients table: the model it "
            "shares before its personalisation step (docs/logs.md says which model each method logs there, e.g. FedBABU's "
            "body under its fixed head before fine-tuning). Paired per seed: mean ± sample std of the differences."
        )
    return table


def _gain_rows(records: list[RunMetrics], title: str, global_label: str, with_method: bool) -> ReportTable | None:
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
        row = [Text(setting), *([Text(method)] if with_method else [])]
        mean_gain = per_metric["mean_accuracy"][(setting, method)]
        row += [Text(_with_std(mean_gain.personalised)), Text(_with_std(mean_gain.global_encoder))]
        for metric, _ in PAIRED_GLOBAL:
            gain = per_metric[metric].get((setting, method))
            row.append(Text("-" if gain is None else _with_std(gain.gain, signed=True)))
        row.append(Text(f"{mean_gain.seeds_helped} of {mean_gain.gain.seeds}"))
        table.rows.append(row)
    return table


PAIRED_METRICS = (("mean_accuracy", "mean"), ("worst_accuracy", "worst"), ("bottom20_accuracy", "bot.20%"))


def paired_table(records: list[RunMetrics], reference: str = "hdcfl") -> ReportTable | None:
    """`reference` minus every other method, seed by seed: runs with the same seed share
    the partition and the initialisation, so their differences are paired. A method
    appears where it has every seed the reference has in that setting."""
    by_key = {(r.setting, r.method, r.seed): r for r in records}
    table = ReportTable(
        f"Paired differences: {reference} minus each method, per seed (pp)",
        ["Setting", "Method", "Seeds", *(f"Diff.: {label}" for _, label in PAIRED_METRICS), "Seeds with mean diff. > 0",
         f"{reference}: " + " / ".join(label for _, label in PAIRED_METRICS)],
    )
    for setting in sorted({r.setting for r in records}):
        seeds = sorted(r.seed for r in records if (r.setting, r.method) == (setting, reference))
        if not seeds:
            continue
        for method in sorted({r.method for r in records if r.setting == setting} - {reference}):
            if any((setting, method, seed) not in by_key for seed in seeds):
                continue
            row = [Text(setting), Text(method), Text(" / ".join(str(seed) for seed in seeds))]
            positive, verdicts = 0, []
            for metric, _ in PAIRED_METRICS:
                diffs = [100.0 * (by_key[(setting, reference, seed)].values[metric] - by_key[(setting, method, seed)].values[metric]) for seed in seeds]
                if metric == "mean_accuracy":
                    positive = sum(diff > 0 for diff in diffs)
                row.append(Text(" / ".join(f"{diff:+.2f}" for diff in diffs)))
                pairs = [(by_key[(setting, reference, seed)].provenance, by_key[(setting, method, seed)].provenance) for seed in seeds]
                verdicts.append(mark_across_machines(paired_verdict(diffs), pairs))
            row.append(Text(f"{positive} of {len(seeds)}"))
            row.append(Text(" / ".join(verdicts)))
            table.rows.append(row)
    if not table.rows:
        return None
    table.note = (
        f"Each cell lists {reference}'s final score minus the method's, seed by seed in the order of the Seeds column. "
        f"Verdict of {reference} against the method, per metric: {RULE}."
    )
    return table


def clustered_table(records: list[RunMetrics]) -> ReportTable | None:
    """Every method that forms client groups: the groups it ended with and their ARI
    against the planted groups beside its accuracy, so a method that found one cluster
    (or the wrong ones) is seen next to the score it explains."""
    grouped = [r for r in records if not math.isnan(r.values.get("num_groups", math.nan))]
    if not grouped:
        return None
    table = ReportTable(
        "Clustered methods: groups found at the final evaluation and their ARI against the planted groups, beside the mean accuracy",
        ["Setting", "Method", "Mean acc.", "Groups found (per seed)", "ARI vs planted", "Flags"],
    )
    flags = row_flags(records)
    accuracy, ari = cells(grouped, "mean_accuracy"), cells(grouped, "ari_true")
    for setting, method in sorted({(r.setting, r.method) for r in grouped}):
        runs = sorted((r for r in grouped if (r.setting, r.method) == (setting, method)), key=lambda r: r.seed)
        found = ", ".join(str(int(r.values["num_groups"])) for r in runs)
        ari_cell = ari.get((setting, method))
        ari_text = "-" if ari_cell is None or math.isnan(ari_cell.mean) else _with_std(ari_cell, scale=1.0)
        row_flag = "; ".join(flags.get((setting, method), [])) or "-"
        table.rows.append(
            [Text(setting), Text(method), Text(_with_std(accuracy[(setting, method)])), Text(found), Text(ari_text), Text(row_flag)]
        )
    table.note = " ".join(
        note
        for note in (
            "Groups: distinct groups among the clients' final assignments (argmax membership for soft methods); ARI 1 = the "
            "planted groups exactly, 0 = chance.",
            flag_note({key: found for key, found in flags.items() if key in {(r.setting, r.method) for r in grouped}}),
        )
        if note
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
    for key in sorted(trained):
        table.rows.append(
            [Text(key[0]), Text(key[1]), Text(_with_std(trained[key])), Text(_with_std(rest[key])), Text(_with_std(difference[key], signed=True))]
        )
    table.note = (
        "Each side is the mean over its clients at the final evaluation, then mean ± sample std over seeds; the difference "
        "is taken per seed. Clients scored with a private head keep it fitted to their own classes; clients scored with a "
        "shared model (a cluster model, a global head) that sat the round out get it as that round's participants left it."
    )
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
    other method. A named `against` that no record holds is bad input (ScenarioError).
    `left_out` (analysis.runs.left_out_note) names the unfinished runs in every table's note."""
    methods = sorted({record.method for record in records})
    if against is not None and against not in methods:
        raise ScenarioError(f"--against {against!r}: no completed run of that method here; the runs hold {', '.join(methods)}")
    tables = [
        per_setting_table(records, "mean_accuracy", with_rank=True, with_macro=False),
        per_setting_table(records, "worst_accuracy", with_rank=False, with_macro=True),
        per_setting_table(records, "bottom20_accuracy", with_rank=False, with_macro=True),
        per_setting_table(records, "gap", with_rank=False, with_macro=True),
        macro_table(records),
    ]
    if any(not math.isnan(r.values.get("mean_accuracy_own_classes", math.nan)) for r in records):
        tables.append(per_setting_table(records, "mean_accuracy_own_classes", with_rank=False, with_macro=False))
    if any(not math.isnan(r.values.get("ari_true", math.nan)) for r in records):
        tables.append(per_setting_table(records, "ari_true", with_rank=False, with_macro=False))
    optional = (clustered_table(records), participation_table(records), budget_table(records), gain_table(records), shared_model_gain_table(records), paired_table(records, against or "hdcfl"))
    from analysis.auto_knobs_table import auto_knobs_table  # these build on this module's tables
    from analysis.communication import communication_table

    optional += (communication_table(records), auto_knobs_table(records))
    every = tables + [table for table in optional if table is not None] + variant_tables(records)
    source = provenance_note(record.provenance for record in records if record.provenance)
    for table in every:  # a table copied on its own still says what produced it and what it lacks
        table.note = " ".join(note for note in (table.note, left_out, source) if note)
    return every


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
    if cell.mark == "best":
        return f"**{cell.value}**"
    if cell.mark == "second":
        return f"<u>{cell.value}</u>"
    return cell.value


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
    text = _latex_escape(cell.value)
    if cell.mark == "best":
        return f"\\textbf{{{text}}}"
    if cell.mark == "second":
        return f"\\underline{{{text}}}"
    return text


def to_csv(tables: list[ReportTable]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    for table in tables:
        writer.writerow([f"# {table.title}"])
        writer.writerow(table.header)
        for row in table.rows:
            writer.writerow([cell.value for cell in row])
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
            rich_table.add_row(*[f"[bold]{escape(c.value)}[/]" if c.mark == "best" else f"[underline]{escape(c.value)}[/]" if c.mark == "second" else escape(c.value) for c in row])
        rendered.append(rich_table)
    return rendered
