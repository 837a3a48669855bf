"""The paper's result tables from final-round client metrics.

Input: one record per run (setting, method, seed, final-round metrics). Output:
per-setting cells (mean +- sample std over seeds, ddof = 1), the best and
second best per setting, the average rank over settings (table 1 form), the
tail tables (worst, bottom-20%, gap; tables 7-9), and macro averages over
settings with a tail rank (table 2 form).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import mean, stdev
from typing import Any

from analysis.participation_split import participation_split
from analysis.provenance import run_provenance
from analysis.run_traffic import run_traffic
from analysis.group_usage import groups_never_held
from analysis.runs import RunRecord
from analysis.setting_groups import place_runs
from analysis.trivial_record import recorded_references
from hdcfl_ray.diagnostics.curve_trend import curve_peak, curve_rises, rounds_curve, scored_curve

# metric -> True when higher is better
METRICS: dict[str, bool] = {
    "mean_accuracy": True,
    "worst_accuracy": True,
    "bottom20_accuracy": True,
    "gap": False,
    "mean_accuracy_global": True,
    "worst_accuracy_global": True,
    "bottom20_accuracy_global": True,
    "ari_true": True,
    "mean_accuracy_own_classes": True,
    "num_groups": True,
    # clients held out of training (partition.newcomers), scored by each method's newcomer rule
    "newcomer_mean_accuracy": True,
    "newcomer_worst_accuracy": True,
    "newcomer_ari_with_clients": True,
}
# training work over the whole run (every round's updates plus training done while
# evaluating, e.g. fine-tuning), summed from rounds.parquet; not ranked
BUDGET_COLUMNS = {
    "samples_trained": "samples_trained",
    "local_steps": "local_steps",
    "eval_samples_trained": "eval_samples_trained",
    "eval_local_steps": "eval_local_steps",
}
TAIL_METRICS = ("worst_accuracy", "bottom20_accuracy", "gap")
# what a run's accuracies were scored on: the test images, or images held out of each
# client's training data (partition.validation_fraction), which no test table includes
SCORED_ON_TEST, SCORED_ON_VALIDATION = "test", "validation"


@dataclass(frozen=True)
class RunMetrics:
    setting: str
    method: str
    seed: int
    values: dict[str, float]  # fractions (accuracies, gap), ARI as is; NaN when absent
    # what produced the run (analysis/provenance.py): commit, CPU/GPU model, torch and Ray versions
    provenance: dict[str, str] = field(default_factory=dict)
    # the values the run chose for its `auto` knobs (its manifest's auto_knobs), or None
    auto_knobs: dict[str, Any] | None = None
    scored_on: str = SCORED_ON_TEST  # SCORED_ON_TEST | SCORED_ON_VALIDATION
    # the knobs pinned to a value chosen for another data setting (the manifest's
    # pinned_for_another_setting: hdcfl_ray/config/pinned_knobs.py), [] for none
    pinned_elsewhere: list[dict[str, Any]] = field(default_factory=list)
    # what trivial predictors score on the run's scored samples (its manifest's
    # trivial_references: analysis/trivial_record.py); None for a run without the record
    trivial_references: dict[str, dict[str, float]] | None = None


@dataclass(frozen=True)
class Cell:
    mean: float
    std: float  # sample std over seeds; NaN for one seed
    seeds: int


def run_metrics(runs: list[RunRecord], keep: str | None = None) -> list[RunMetrics]:
    """One record per finished run, under the column and row analysis.setting_groups
    gives it (runs not yet placed are placed here, `keep` saying which of two runs of
    one method, setting and seed to keep; without it such runs raise DuplicateRunsError)."""
    finished = [run for run in runs if run.finished]
    if not all(run.column is not None and run.row is not None for run in finished):
        finished = place_runs(finished, keep).runs
    records = []
    for run in finished:
        final = run.final_evaluated_round()
        assert final is not None
        values = {metric: _float(final.get(metric)) for metric in METRICS}
        values.update(run_budget(run.rounds.to_pylist()))
        values.update(run_traffic(run.rounds.to_pylist()))
        values["membership_entropy"] = final_membership_entropy(run, int(final["round"]))
        values.update(participation_split(run, int(final["round"])))
        values["evaluated_fraction"] = evaluated_fraction(final, run_trained_client_count(run))
        values.update(refresh_diagnostics(run))
        rounds = run.rounds.to_pylist()
        values["late_rise"], values["total_rise"], values["late_rise_error"] = curve_rises(rounds_curve(rounds))
        values["peak_accuracy"], values["peak_round"] = curve_peak(scored_curve(rounds))
        values["groups_asked"] = groups_asked(run.scenario)
        values["groups_never_held"], values["groups_available"] = groups_never_held(run, values["groups_asked"])
        count = run_client_count(run)
        values["num_clients"] = float(count) if count is not None else math.nan
        # resumes that went on with the clients on other hosts (simulate --allow-layout-change)
        values["host_layout_changes"] = float(len(run.manifest.get("host_layout_changes") or []))
        scored_on = SCORED_ON_VALIDATION if run.scored_on_validation else SCORED_ON_TEST
        pinned = [item for item in run.manifest.get("pinned_for_another_setting") or [] if isinstance(item, dict)]
        records.append(
            RunMetrics(
                run.setting, run.method, run.seed, values, run_provenance(run.manifest), run.manifest.get("auto_knobs"), scored_on, pinned,
                trivial_references=recorded_references(run.manifest),
            )
        )
    return records


def run_client_count(run: Any) -> int | None:
    """The run's number of clients: the scenario's count, or for `num_clients: all` the
    count the manifest recorded (None where neither says)."""
    partition = run.scenario.get("partition")
    count = partition.get("num_clients") if isinstance(partition, dict) else None
    if isinstance(count, int):
        return count
    recorded = (run.manifest.get("dataset") or {}).get("num_clients")
    return recorded if isinstance(recorded, int) else None


def run_trained_client_count(run: Any) -> int | None:
    """The clients a run trains and evaluates: its clients less the newcomers it held out
    (partition.newcomers, listed in the manifest's `evaluation.newcomers`), which are
    scored in a table of their own and never in the clients' evaluation."""
    count = run_client_count(run)
    newcomers = (run.manifest.get("evaluation") or {}).get("newcomers") or []
    return None if count is None else count - len(newcomers)


def evaluated_fraction(final_round: dict[str, object], num_clients: int | None) -> float:
    """The share of the federation the final evaluation scored (1.0 unless
    `protocol.eval_clients` sampled it; 1.0 for runs logged before the column)."""
    evaluated = final_round.get("num_evaluated")
    if not isinstance(evaluated, int) or not isinstance(num_clients, int) or num_clients <= 0:
        return 1.0
    return evaluated / num_clients


def final_membership_entropy(run: RunRecord, round_index: int) -> float:
    """Mean over clients of the normalised entropy H(m) / log S of each client's
    memberships at `round_index` (1 = uniform, 0 = one cluster); NaN where the
    method logs no memberships over two or more clusters."""
    if "memberships" not in run.clients.column_names:
        return math.nan
    rounds = run.clients.column("round").to_pylist()
    entropies = []
    for row_round, memberships in zip(rounds, run.clients.column("memberships").to_pylist()):
        if row_round != round_index or not memberships or len(memberships) < 2:
            continue
        weights = [w for w in memberships if w and w > 0]
        total = sum(weights)
        entropy = -sum((w / total) * math.log(w / total) for w in weights)
        entropies.append(entropy / math.log(len(memberships)))
    return mean(entropies) if entropies else math.nan


# the keys under which a method's section sets how many groups (clusters, centres) it forms
GROUP_COUNT_KEYS = ("groups", "clusters", "centers")


def groups_asked(scenario: dict[str, object]) -> float:
    """The group count the run's method was configured with (NaN when it sets none), so
    that a variant run with one group on purpose is not reported as collapsed."""
    algorithm = scenario.get("algorithm")
    if not isinstance(algorithm, dict):
        return math.nan
    section = algorithm.get(str(algorithm.get("name")))
    if not isinstance(section, dict):
        return math.nan
    counts = [section[key] for key in GROUP_COUNT_KEYS if isinstance(section.get(key), int)]
    return float(counts[0]) if counts else math.nan


REFRESH_DIAGNOSTICS = {"refresh_silhouette": "silhouette", "refresh_ari_previous": "ari_previous"}


def refresh_diagnostics(run: RunRecord) -> dict[str, float]:
    """Table 10's columns: the silhouette of each refresh's grouping and the ARI between
    the groups of consecutive refreshes, each averaged over the run's refreshes (NaN
    for a run without refreshes or a column it did not log)."""
    values = {}
    for name, column in REFRESH_DIAGNOSTICS.items():
        logged = run.refresh.column(column).to_pylist() if column in run.refresh.column_names else []
        present = [float(v) for v in logged if v is not None and not math.isnan(float(v))]
        values[name] = mean(present) if present else math.nan
    return values


def run_budget(rounds: list[dict[str, object]]) -> dict[str, float]:
    """Totals of the budget columns over a run's rounds, and the number of rounds
    (NaN for runs logged before the columns existed)."""
    totals: dict[str, float] = {"rounds": float(len(rounds))}
    for name, column in BUDGET_COLUMNS.items():
        present = [row.get(column) for row in rounds if row.get(column) is not None]
        totals[name] = float(sum(present)) if present and len(present) == len(rounds) else math.nan  # type: ignore[arg-type]
    return totals


def _float(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) and value is not None else math.nan


def cells(records: list[RunMetrics], metric: str) -> dict[tuple[str, str], Cell]:
    grouped: dict[tuple[str, str], list[float]] = {}
    for record in records:
        grouped.setdefault((record.setting, record.method), []).append(record.values.get(metric, math.nan))
    return {key: _cell([v for v in values if not math.isnan(v)]) for key, values in grouped.items()}


# (headline metric, the same run's global-encoder metric): HDC-FL scores every client
# with its prototype mixture and, beside it, with the global encoder and its own head.
PAIRED_GLOBAL = (
    ("mean_accuracy", "mean_accuracy_global"),
    ("worst_accuracy", "worst_accuracy_global"),
    ("bottom20_accuracy", "bottom20_accuracy_global"),
)


@dataclass(frozen=True)
class GainCell:
    """The personalisation gain over the same run's global encoder, paired by seed."""

    personalised: Cell
    global_encoder: Cell
    gain: Cell  # of the per-seed differences personalised - global
    seeds_helped: int  # seeds whose difference is > 0


def personalisation_gains(records: list[RunMetrics], metric: str = "mean_accuracy") -> dict[tuple[str, str], GainCell]:
    """Per (setting, method) that logs a global-encoder score: personalised, global and
    their paired difference, mean +- sample std over seeds."""
    global_metric = dict(PAIRED_GLOBAL)[metric]
    paired: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for record in records:
        own, shared = record.values.get(metric, math.nan), record.values.get(global_metric, math.nan)
        if math.isnan(own) or math.isnan(shared):
            continue
        paired.setdefault((record.setting, record.method), []).append((own, shared))
    return {
        key: GainCell(
            personalised=_cell([own for own, _ in pairs]),
            global_encoder=_cell([shared for _, shared in pairs]),
            gain=_cell([own - shared for own, shared in pairs]),
            seeds_helped=sum(own > shared for own, shared in pairs),
        )
        for key, pairs in paired.items()
    }


def _cell(values: list[float]) -> Cell:
    """Mean and sample std (statistics.stdev: ddof = 1) of finite values; NaN where undefined."""
    return Cell(
        mean=mean(values) if values else math.nan,
        std=stdev(values) if len(values) > 1 else math.nan,
        seeds=len(values),
    )


def ranks_within(values: dict[str, float], higher_is_better: bool) -> dict[str, float]:
    """Rank 1 = best; ties share the average of their ranks; NaN entries are left out."""
    present = {k: v for k, v in values.items() if not math.isnan(v)}
    ordered = sorted(present, key=lambda k: -present[k] if higher_is_better else present[k])
    ranks: dict[str, float] = {}
    position = 0
    while position < len(ordered):
        tied = [k for k in ordered[position:] if present[k] == present[ordered[position]]]
        shared = position + (len(tied) + 1) / 2
        for key in tied:
            ranks[key] = shared
        position += len(tied)
    return ranks


def settings_and_methods(records: list[RunMetrics]) -> tuple[list[str], list[str]]:
    settings = sorted({r.setting for r in records})
    methods = sorted({r.method for r in records})
    return settings, methods


def variant_base(setting: str) -> str:
    """The setting a variant's column belongs to: its scenario's name up to the first dot
    (`hdcfl-ray ablate` names a replay `<base>.<variant>`, `hdcfl-ray calibrate` a knob's
    value `<base>.<knob>-<value>`), followed by what the column's name adds after the
    scenario name (` (validation)`, ` [key=value, ...]`, whose values may hold dots
    themselves); a column that is no variant is its own base."""
    name, space, rest = setting.partition(" ")
    return name.split(".", 1)[0] + space + rest


def ranked_settings(records: list[RunMetrics]) -> list[str]:
    """The settings ranks and macro values average over: every setting but the variants
    of a setting the report also holds (a replay, a calibration value), which are the
    same benchmark again: left beside it, they would outweigh it and leave every method
    that has no such variant without a rank."""
    settings = {r.setting for r in records}
    return sorted(s for s in settings if variant_base(s) == s or variant_base(s) not in settings)


def unranked_settings(records: list[RunMetrics]) -> list[str]:
    """The variant columns ranked_settings leaves out."""
    ranked = set(ranked_settings(records))
    return sorted({r.setting for r in records} - ranked)


def complete_methods(records: list[RunMetrics], metric: str = "mean_accuracy") -> tuple[list[str], list[str]]:
    """(methods with a value in every ranked setting of the report, methods missing one).
    Averages over settings and ranks compare only the complete ones: a method's mean
    over the settings it happened to run is not comparable with one over all."""
    table = cells(records, metric)
    _, methods = settings_and_methods(records)
    settings = ranked_settings(records)
    complete = [m for m in methods if all((s, m) in table and not math.isnan(table[(s, m)].mean) for s in settings)]
    return complete, [m for m in methods if m not in complete]


def average_rank(records: list[RunMetrics], metric: str = "mean_accuracy") -> dict[str, float]:
    """Rank within each ranked setting (ranked_settings) by the mean over seeds, then averaged
    over those settings; only methods with a value in each are ranked (the others get NaN)."""
    table = cells(records, metric)
    settings = ranked_settings(records)
    methods, missing = complete_methods(records, metric)
    per_method: dict[str, list[float]] = {m: [] for m in methods + missing}
    for setting in settings:
        values = {m: table[(setting, m)].mean for m in methods if (setting, m) in table}
        for method, rank in ranks_within(values, METRICS[metric]).items():
            per_method[method].append(rank)
    return {m: mean(r) if r else math.nan for m, r in per_method.items()}


def tail_rank(records: list[RunMetrics]) -> dict[str, float]:
    """Mean over settings and over worst, bottom-20% (higher better) and gap (lower
    better) of each method's rank; only methods with every setting are ranked."""
    settings = ranked_settings(records)
    methods, missing = complete_methods(records, "mean_accuracy")
    per_method: dict[str, list[float]] = {m: [] for m in methods + missing}
    for metric in TAIL_METRICS:
        table = cells(records, metric)
        for setting in settings:
            values = {m: table[(setting, m)].mean for m in methods if (setting, m) in table}
            for method, rank in ranks_within(values, METRICS[metric]).items():
                per_method[method].append(rank)
    return {m: mean(r) if r else math.nan for m, r in per_method.items()}


def macro_average(records: list[RunMetrics], metric: str) -> dict[str, float]:
    """Per method: the mean over settings of the setting-level means (table 2, 9);
    NaN for a method without a value in every setting."""
    table = cells(records, metric)
    settings = ranked_settings(records)
    methods, missing = complete_methods(records, metric)
    result = {method: math.nan for method in missing}
    for method in methods:
        values = [table[(s, method)].mean for s in settings if (s, method) in table and not math.isnan(table[(s, method)].mean)]
        result[method] = mean(values) if values else math.nan
    return result


def best_two(table: dict[tuple[str, str], Cell], setting: str, methods: list[str], higher_is_better: bool) -> tuple[set[str], set[str]]:
    ranks = ranks_within({m: table[(setting, m)].mean for m in methods if (setting, m) in table}, higher_is_better)
    if not ranks:
        return set(), set()
    ordered = sorted(set(ranks.values()))
    best = {m for m, r in ranks.items() if r == ordered[0]}
    second = {m for m, r in ranks.items() if len(ordered) > 1 and r == ordered[1]} if len(best) == 1 else set()
    return best, second
