"""How well does each method serve a client that never trained?

Reads one sweep folder of runs with newcomers (`partition.newcomers`: clients held out of
every round and scored at each evaluated round by the method's own newcomer rule,
docs/newcomers.md) and writes, per method at each run's final evaluated round, over the
seeds: the trained clients' mean accuracy; the newcomers' mean, worst and bottom-20%
accuracy; the gap trained minus newcomers seed by seed with the paired verdict of
analysis/verdict.py; the ARI of the newcomers' placement against the planted groups
(together with the evaluated clients, and among themselves); the rule, the training
each newcomer did and the bytes it exchanged; the runs' trivial references; and a second
table of each method's newcomer mean accuracy paired against FedAvg's, seed by seed.

    python -m studies.newcomer_tables runs/newcomers/rot --out docs/newcomer-tables.md

The sweep: scenarios/sweeps/newcomers-rot.yaml; the page: docs/newcomers.md.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from statistics import mean, stdev
from typing import Any

from hdcfl_ray.contract import NO_NEWCOMER_RULE

from analysis.final_metrics import run_metrics
from analysis.provenance import ACROSS_MACHINES, mark_across_machines, run_provenance
from analysis.row_flags import FLAG_RULES, flag_name, row_flags
from analysis.runs import RunRecord, left_out_note, load_runs, unfinished
from analysis.setting_groups import place_runs
from analysis.trivial_record import recorded_references
from analysis.trivial_rows import PREFIX as REFERENCE_PREFIX
from analysis.verdict import AHEAD, BEHIND, INDISTINGUISHABLE, RULE, paired_verdict

BASELINE = "fedavg"
POINTS = 100.0  # accuracies and ARI are shown x100
NO_NEWCOMERS = "no newcomers (partition.newcomers unset)"
NO_RULE_CELL = "no rule"
KILOBYTE = 1e3
# The report's flags but one: a run with newcomers evaluates the clients that train (16 of
# 20), which the "sampled evaluation" rule, counting every client of the partition, reads as a sample.
LEFT_OUT_FLAGS = ("sampled evaluation",)
# Differences (in points) closer to zero than this are float noise, equal scores summed in
# another order, and count as none: noise of one sign at every seed is no verdict.
NOISE = 1e-9
# (rounds.parquet column, label): the newcomers' headline accuracies
NEWCOMER_ACCURACIES = (
    ("newcomer_mean_accuracy", "newcomer mean acc."),
    ("newcomer_worst_accuracy", "newcomer worst acc."),
    ("newcomer_bottom20_accuracy", "newcomer bottom-20% acc."),
)
# (rounds.parquet column, label, scale): the work and bytes per newcomer at the final round
PER_NEWCOMER = (
    ("newcomer_samples_trained", "samples trained / newcomer", 1.0),
    ("newcomer_local_steps", "steps / newcomer", 1.0),
    ("newcomer_bytes_down", "KB down / newcomer", 1 / KILOBYTE),
    ("newcomer_bytes_up", "KB up / newcomer", 1 / KILOBYTE),
)
HEADER = [
    "Setting", "Method", "Seeds", "newcomer rule", "E", "trained mean acc.",
    *(label for _, label in NEWCOMER_ACCURACIES),
    "gap trained - newcomer per seed", "gap verdict", "ARI newcomers with clients", "ARI among newcomers",
    *(label for _, label, _ in PER_NEWCOMER), "flags",
]  # fmt: skip
VERSUS_HEADER = ["Setting", "Method", "Seeds", "newcomer mean acc.", "FedAvg's newcomer mean acc.", "diff. per seed", "verdict"]


@dataclass(frozen=True)
class MethodRuns:
    """One method's finished runs of one setting, by seed, with each run's final evaluated round."""

    setting: str
    method: str
    runs: dict[int, RunRecord]
    finals: dict[int, dict[str, Any]]  # seed -> that run's final evaluated rounds.parquet row

    @property
    def seeds(self) -> list[int]:
        return sorted(self.runs)

    def final(self, column: str, seeds: list[int] | None = None) -> list[float]:
        """The column at each seed's final evaluated round (NaN where null or absent)."""
        return [_number(self.finals[seed].get(column)) for seed in (self.seeds if seeds is None else seeds)]

    def rules(self) -> list[str]:
        """The newcomer rules the runs' manifests record (NO_NEWCOMERS for a run without newcomers)."""
        return sorted({str(_evaluation(run).get("newcomer_rule") or NO_NEWCOMERS) for run in self.runs.values()})

    @property
    def has_rule(self) -> bool:
        return all(rule not in (NO_NEWCOMER_RULE, NO_NEWCOMERS) for rule in self.rules())

    @property
    def declares_none(self) -> bool:
        return NO_NEWCOMER_RULE in self.rules()


def sweep_runs(folder: Path) -> tuple[list[MethodRuns], list[RunRecord]]:
    """The finished runs under `folder` grouped by setting and method (one run per seed: a
    repeat raises DuplicateRunsError naming both folders), and the unfinished ones."""
    loaded = load_runs([folder])
    grouped: dict[tuple[str, str], dict[int, RunRecord]] = {}
    for run in place_runs([run for run in loaded if run.finished]).runs:
        grouped.setdefault((run.setting, run.method), {})[run.seed] = run
    methods = [
        MethodRuns(setting, method, dict(sorted(by_seed.items())), {seed: _final_round(run) for seed, run in by_seed.items()})
        for (setting, method), by_seed in sorted(grouped.items())
    ]
    return methods, unfinished(loaded)


def method_row(group: MethodRuns, flags: list[str]) -> str:
    """The method's row of the newcomer table; 'no rule' in its newcomer cells where it declares none."""
    cells = [group.setting, group.method, _seeds(group.seeds), _escaped("; ".join(group.rules())), _epochs(group)]
    cells.append(_cell([POINTS * value for value in group.final("mean_accuracy")]))
    if group.has_rule:
        cells += [_cell([POINTS * value for value in group.final(column)]) for column, _ in NEWCOMER_ACCURACIES]
        trained, newcomers = group.final("mean_accuracy"), group.final("newcomer_mean_accuracy")
        cells += _paired([_difference(POINTS * t, POINTS * n) for t, n in zip(trained, newcomers)])
    else:
        blank = NO_RULE_CELL if group.declares_none else "-"
        cells += [blank] * (len(NEWCOMER_ACCURACIES) + 2)
    cells += [_cell([POINTS * value for value in group.final(column)]) for column in ("newcomer_ari_with_clients", "newcomer_ari_true")]
    counts = group.final("num_newcomers")
    for column, _, unit in PER_NEWCOMER:
        cells.append(_cell([unit * total / count for total, count in zip(group.final(column), counts) if count > 0]))
    cells.append("; ".join(flags) or "-")
    return _row(cells)


def reference_rows(setting: str, groups: list[MethodRuns]) -> list[str]:
    """The trivial references the runs of `setting` recorded (one partition per seed,
    whatever the method): their mean accuracy over the trained clients, in that column."""
    by_reference: dict[str, dict[int, dict[str, float]]] = {}
    for group in groups:
        for seed, run in group.runs.items():
            for reference, summary in (recorded_references(run.manifest) or {}).items():
                by_reference.setdefault(reference, {}).setdefault(seed, summary)
    rows = []
    for reference, by_seed in sorted(by_reference.items()):
        seeds = sorted(by_seed)
        trained = _cell([POINTS * by_seed[seed].get("mean_accuracy", math.nan) for seed in seeds])
        rows.append(_row([setting, f"*{REFERENCE_PREFIX}{reference}*", _seeds(seeds), "-", "-", trained, *["-"] * (len(HEADER) - 6)]))
    return rows


def versus_baseline_rows(setting: str, groups: list[MethodRuns]) -> list[str]:
    """Each method's newcomer mean accuracy against FedAvg's on the seeds both ran ([] without FedAvg)."""
    baseline = next((group for group in groups if group.method == BASELINE and group.has_rule), None)
    if baseline is None:
        return []
    rows = []
    for group in groups:
        if group.method == BASELINE:
            continue
        seeds = [seed for seed in group.seeds if seed in baseline.runs]
        if not group.has_rule:
            blank = NO_RULE_CELL if group.declares_none else "-"
            rows.append(_row([setting, group.method, _seeds(seeds), blank, _cell(_accuracies(baseline, seeds)), blank, blank]))
            continue
        own, theirs = _accuracies(group, seeds), _accuracies(baseline, seeds)
        shown, verdict = _paired([_difference(a, b) for a, b in zip(own, theirs)])
        if verdict in (AHEAD, BEHIND, INDISTINGUISHABLE):
            pairs = [(run_provenance(group.runs[seed].manifest), run_provenance(baseline.runs[seed].manifest)) for seed in seeds]
            verdict = mark_across_machines(verdict, pairs)
        rows.append(_row([setting, group.method, _seeds(seeds), _cell(own), _cell(theirs), shown, verdict]))
    return rows


def shown_flags(runs: list[RunRecord]) -> dict[tuple[str, str], list[str]]:
    """(setting, method) -> the report's flags that apply (analysis/row_flags.py), but LEFT_OUT_FLAGS."""
    found = row_flags(run_metrics(runs))
    return {key: [flag for flag in flags if flag_name(flag) not in LEFT_OUT_FLAGS] for key, flags in found.items()}


def tables(folder: Path, out: Path) -> list[str]:
    """The page's lines: the newcomer table, the table against FedAvg, and their notes."""
    groups, left_out = sweep_runs(folder)
    flags = shown_flags([run for group in groups for run in group.runs.values()])
    settings = sorted({group.setting for group in groups})
    lines = [f"<!-- generated by: python -m studies.newcomer_tables {folder} --out {out} -->", "", "## Newcomers against the trained clients", ""]
    lines += [_row(HEADER), "|" + "---|" * len(HEADER)]
    for setting in settings:
        own = [group for group in groups if group.setting == setting]
        lines += [method_row(group, flags.get((setting, group.method), [])) for group in own] + reference_rows(setting, own)
    lines += ["", _main_note(flags)]
    lines += ["", "## Each method's newcomers against FedAvg's", ""]
    lines += [_row(VERSUS_HEADER), "|" + "---|" * len(VERSUS_HEADER)]
    without_baseline = []
    for setting in settings:
        rows = versus_baseline_rows(setting, [group for group in groups if group.setting == setting])
        lines += rows
        without_baseline += [] if rows else [setting]
    lines += ["", _versus_note(without_baseline)]
    if left_out:
        lines += ["", left_out_note(left_out)]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep", type=Path, help="the sweep folder (scenarios/sweeps/newcomers-rot.yaml's out)")
    parser.add_argument("--out", type=Path, default=Path("docs/newcomer-tables.md"), help="the Markdown tables")
    args = parser.parse_args(argv)
    if not args.sweep.is_dir():
        parser.error(f"{args.sweep}: no such folder; run the sweep first (hdcfl-ray sweep scenarios/sweeps/newcomers-rot.yaml)")
    lines = tables(args.sweep, args.out)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


def _main_note(flags: dict[tuple[str, str], list[str]]) -> str:
    used = {flag_name(flag) for found in flags.values() for flag in found}
    rules = "; ".join(f"[{name}] {rule}" for name, rule in FLAG_RULES.items() if name in used)
    return (
        "Each run's final evaluated round, mean ± sample std over the seeds; accuracies in %, ARI x100. trained: the "
        "clients that trained (rounds.parquet mean_accuracy); newcomers: the clients partition.newcomers held out of "
        "every round, scored by the method's newcomer rule in the row (the manifest's newcomer_rule) after at most "
        "E = protocol.newcomer_epochs epochs of training on their own data (rounds.parquet newcomer_*). gap per seed: "
        "the trained clients' mean minus the newcomers', seed by seed; its verdict, of the trained clients against the "
        f"newcomers: {RULE}. ARI against the planted groups: of the newcomers' placement together with the evaluated "
        "clients' groups (1 only when every newcomer joins its planted group's clients), and of the newcomers among "
        "themselves; '-' for a method that places no client in a group, or with fewer than two placed newcomers. "
        "samples, steps: the training a newcomer did to be scored at that round; KB down / up: what the server sent a "
        "newcomer to place and score it, and what it sent back (PACFL's subspace), 10^3 bytes, none of it in the "
        "training traffic; each the mean over the newcomers. 'no rule': the method declares no newcomer rule, so its "
        "newcomers are scored nothing (never zero). *reference* rows: the trivial references the runs recorded (each "
        "trained client's own majority class, or the pooled one, scored on its test set), over the trained clients "
        "only: newcomers are not among the clients they score."
        + (f" Flags (the report's rules, analysis/row_flags.py, on the trained clients' scores): {rules}." if rules else "")
    )


def _versus_note(without_baseline: list[str]) -> str:
    note = (
        "Newcomer mean accuracy in % at each run's final evaluated round, mean ± sample std over the seeds both ran; "
        "FedAvg's newcomers get the global model as it stands. diff. per seed: the method minus FedAvg, seed by seed. "
        f"Verdict of the method's newcomers against FedAvg's: {RULE}; marked {ACROSS_MACHINES} where a pair of runs was "
        "computed in different arithmetic (analysis/provenance.py). 'no rule': the method declares no newcomer rule."
    )
    if without_baseline:
        note += f" No finished FedAvg runs with newcomers in {', '.join(without_baseline)}: no pairing there."
    return note


def _paired(differences: list[float]) -> list[str]:
    """[the per-seed differences, their verdict] ('-' where a seed has none)."""
    if not differences or all(math.isnan(d) for d in differences):
        return ["-", "-"]
    shown = " / ".join("-" if math.isnan(d) else f"{d:+.2f}" for d in differences)
    return [shown, "-" if any(math.isnan(d) for d in differences) else paired_verdict(differences)]


def _difference(first: float, second: float) -> float:
    difference = first - second
    return 0.0 if abs(difference) < NOISE else difference


def _accuracies(group: MethodRuns, seeds: list[int]) -> list[float]:
    return [POINTS * value for value in group.final("newcomer_mean_accuracy", seeds)]


def _cell(values: list[float]) -> str:
    finite = [value for value in values if not math.isnan(value)]
    if not finite:
        return "-"
    return f"{mean(finite):.2f} ± {stdev(finite):.2f}" if len(finite) > 1 else f"{finite[0]:.2f}"


def _epochs(group: MethodRuns) -> str:
    epochs = sorted({_evaluation(run).get("newcomer_epochs") for run in group.runs.values()}, key=str)
    return ", ".join("-" if value is None else str(value) for value in epochs)


def _evaluation(run: RunRecord) -> dict[str, Any]:
    evaluation = run.manifest.get("evaluation")
    return evaluation if isinstance(evaluation, dict) else {}


def _final_round(run: RunRecord) -> dict[str, Any]:
    final = run.final_evaluated_round()
    assert final is not None  # only finished runs are grouped
    return final


def _number(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def _seeds(seeds: list[int]) -> str:
    return ", ".join(map(str, seeds))


def _escaped(text: str) -> str:
    """A cell's text with its pipes escaped (Ditto's rule writes a norm as ||v - w||)."""
    return text.replace("|", "\\|")


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


if __name__ == "__main__":
    raise SystemExit(main())
