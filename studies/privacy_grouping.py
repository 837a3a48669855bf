"""How much accuracy and grouping quality does client-level DP cost, level by level?

Reads, per setting, the sweep folders of its privacy levels and of its run without privacy
(analysis/privacy_levels.py pairs them: the same setting, method and knobs, the privacy
section apart) and writes, per setting, method and level: the epsilon the runs were given
and reached (RDP), z, the seeds, the final mean and worst-client accuracy and the ARI of
the method's final client groups against the planted groups (the rounds table's ari_true,
from the groups the clients table logs), each with its per-seed difference from the run
without privacy and the paired verdict of analysis/verdict.py, and the share of the
releases spent on descriptors against models (analysis/privacy_releases.py); the runs'
trivial references; and with --figures the report's metric-against-epsilon figure
(analysis/privacy_figure.py) per setting.

    python -m studies.privacy_grouping \\
        --setting rotation runs/privacy/rot-eps1 runs/privacy/rot-eps2 runs/privacy/rot-eps4 \\
            runs/privacy/rot-eps8 runs/privacy/rot-nodp \\
        --out docs/privacy-study-tables.md --figures docs/figures

The sweeps: scenarios/sweeps/privacy-*.yaml; the page: docs/privacy-study.md.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from statistics import mean, stdev

from analysis.figure_files import file_part
from analysis.privacy_figure import MIN_PRIVATE_LEVELS, epsilon_figure
from analysis.privacy_levels import Level, Line, privacy_lines
from analysis.privacy_releases import release_split
from analysis.provenance import mark_across_machines, run_provenance
from analysis.runs import RunRecord, load_runs
from analysis.setting_groups import place_runs
from analysis.trivial_record import recorded_references
from analysis.verdict import RULE, paired_verdict
from hdcfl_ray.diagnostics.curve_trend import RISING_RULE, curve_rises, rounds_curve, still_rising

# (final metric, label, scale): accuracies and ARI in points
COMPARED = (("mean_accuracy", "mean acc.", 100.0), ("worst_accuracy", "worst acc.", 100.0), ("ari_true", "ARI", 100.0))
HEADER = ["Setting", "Method", "epsilon target", "epsilon reached (RDP)", "z", "Seeds",
          *(f"{label}{part}" for _, label, _ in COMPARED for part in ("", " diff. vs no DP per seed", " verdict")),
          "groups at the final round per seed", "releases: descriptor / model (descriptor share)"]  # fmt: skip


def setting_runs(folders: list[Path]) -> list[RunRecord]:
    """The finished runs under `folders`, one per setting, method and seed (a repeat raises
    DuplicateRunsError naming both folders)."""
    return place_runs([run for run in load_runs(folders) if run.finished]).runs


def cell(values: list[float]) -> str:
    finite = [value for value in values if not math.isnan(value)]
    if not finite:
        return "-"
    return f"{mean(finite):.2f} ± {stdev(finite):.2f}" if len(finite) > 1 else f"{finite[0]:.2f}"


def level_rows(setting: str, line: Line) -> list[str]:
    """One row per level of `line`: its private levels by epsilon, then no DP."""
    rows = []
    for level in line.levels:
        cells = [setting, line.method, _target(level), _reached(level), _noise(level), ", ".join(map(str, level.seeds))]
        for metric, _, scale in COMPARED:
            shown = cell([scale * run.values[metric] for run in level.runs]) + (_rising(level) if metric == "mean_accuracy" else "")
            cells += [shown, *_paired(level, line.no_dp, metric, scale)]
        cells += [_groups(level), _releases(level)]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def _rising(level: Level) -> str:
    """' (still rising: +4.9 pp in the last third)' where the level's curves had not flattened
    when its runs stopped (hdcfl_ray/diagnostics/curve_trend.py), else ''."""
    rises = [curve_rises(rounds_curve(run.run.rounds.to_pylist())) for run in level.runs]
    late = [r.late for r in rises]
    if not still_rising(late, [r.total for r in rises], [r.late_error for r in rises]):
        return ""
    return f" (still rising: +{100 * mean(v for v in late if not math.isnan(v)):.1f} pp in the last third)"


def final_group_count(run: RunRecord) -> int | None:
    """How many distinct groups the clients are in at the run's last evaluated round (None
    where the method logs no group)."""
    clients = run.clients.to_pydict()
    if "group" not in clients or not clients["round"]:
        return None
    last = max(clients["round"])
    groups = {group for round_index, group in zip(clients["round"], clients["group"]) if round_index == last and group is not None}
    return len(groups) or None


def _groups(level: Level) -> str:
    """The groups each seed's run ends with, and a mark where every seed collapsed into one,
    or where the groups found say nothing of the planted ones at any seed (ARI at most 0)."""
    counts = [final_group_count(run.run) for run in sorted(level.runs, key=lambda run: run.run.seed)]
    if all(count is None for count in counts):
        return "-"
    text = " / ".join("-" if count is None else str(count) for count in counts)
    if all(count == 1 for count in counts):
        return f"{text} (collapsed: one group)"
    aris = [run.values.get("ari_true", math.nan) for run in level.runs]
    if aris and all(math.isfinite(ari) and ari <= 0.0 for ari in aris):
        return f"{text} (lost: ARI at most 0 at every seed)"
    return text


def reference_rows(name: str, lines: list[Line]) -> list[str]:
    """The trivial references the runs recorded (one partition per seed, whatever the method
    or level): mean and worst client accuracy over the seeds."""
    by_reference: dict[str, dict[int, dict[str, float]]] = {}
    for line in lines:
        for level in line.levels:
            for run in level.runs:
                for reference, summary in (recorded_references(run.run.manifest) or {}).items():
                    by_reference.setdefault(reference, {}).setdefault(run.run.seed, summary)
    rows = []
    for reference, by_seed in sorted(by_reference.items()):
        seeds = sorted(by_seed)
        cells = [name, f"*reference: {reference}*", "-", "-", "-", ", ".join(map(str, seeds))]
        for metric, _, scale in COMPARED:
            shown = cell([scale * by_seed[seed].get(metric, math.nan) for seed in seeds]) if metric != "ari_true" else "-"
            cells += [shown, "-", "-"]
        rows.append("| " + " | ".join(cells + ["-"]) + " |")
    return rows


def missing_note(name: str, lines: list[Line]) -> str:
    """The lines without a run without privacy, and the methods absent from some level ('' when none)."""
    notes = [f"{name} / {line.method}: no run without privacy of the same setting and knobs, so no verdict"
             for line in lines if line.no_dp is None]  # fmt: skip
    epsilons = sorted({_level_key(level) for line in lines for level in line.private_levels})
    for line in lines:
        own = {_level_key(level) for level in line.private_levels}
        if own != set(epsilons):
            notes.append(f"{name} / {line.method}: no finished run at epsilon {', '.join(e for e in epsilons if e not in own)}")
    return "; ".join(notes)


def _level_key(level: Level) -> str:
    """What makes two methods' levels one level: the epsilon target where the runs were
    given one (each method reaches it to its own rounding: 0.995 and 0.997 for a target of
    1), else the epsilon reached."""
    return _target(level) if level.target_epsilon is not None else _epsilon_text(level)


def cohort_note(lines: list[Line]) -> str:
    """The noise cohort the private runs computed with, in the manifest's words."""
    said = set()
    for line in lines:
        for level in line.private_levels:
            record = level.runs[0].run.manifest.get("privacy") or {}
            cohort, factor, training = record.get("noise_cohort_size"), record.get("noise_cohort_factor"), record.get("training_clients")
            if cohort and factor and training:
                said.add(
                    f"noise cohort {cohort}: each round's noise is that of {cohort} clients (the simulation trains "
                    f"{record.get('expected_cohort'):.3g} a round on average, sample rate q = {record.get('sample_rate'):.3g}); "
                    f"the epsilon holds for a deployment of {training / factor:.4g} clients sampled at the same q"
                )
            else:
                said.add("noise calibrated to the simulated cohort (no noise_cohort_size)")
    return "; ".join(sorted(said))


def _paired(level: Level, no_dp: Level | None, metric: str, scale: float) -> list[str]:
    """[per-seed differences from no DP, verdict] of a private level ('-' for no DP itself or without one)."""
    if not level.private or no_dp is None:
        return ["-", "-"]
    plain = no_dp.by_seed()
    shared = [run for run in level.runs if run.run.seed in plain]
    diffs = [scale * (run.values[metric] - plain[run.run.seed].values[metric]) for run in shared]
    if not diffs or all(math.isnan(d) for d in diffs):
        return ["-", "-"]
    shown = " / ".join("-" if math.isnan(d) else f"{d:+.2f}" for d in diffs)
    if any(math.isnan(d) for d in diffs):
        return [shown, "-"]
    pairs = [(run_provenance(run.run.manifest), run_provenance(plain[run.run.seed].run.manifest)) for run in shared]
    return [shown, mark_across_machines(paired_verdict(diffs), pairs)]


def _target(level: Level) -> str:
    if not level.private:
        return "no DP"
    return f"{level.target_epsilon:g}" if level.target_epsilon is not None else "- (z given)"


def _epsilon_text(level: Level) -> str:
    return "inf" if not level.private else "not recorded" if math.isnan(level.epsilon) else f"{level.epsilon:.3g}"


def _reached(level: Level) -> str:
    return "-" if not level.private else _epsilon_text(level)


def _noise(level: Level) -> str:
    if not level.private:
        return "-"
    values = {(run.run.manifest.get("privacy") or {}).get("noise_multiplier") for run in level.runs}
    return ", ".join(f"{value:.3g}" if isinstance(value, (int, float)) else "-" for value in sorted(values, key=str))


def _releases(level: Level) -> str:
    if not level.private:
        return "-"
    splits = [release_split(run.run) for run in level.runs]
    if any(split is None for split in splits):
        return "not recorded"
    shown = {f"{split.descriptor} / {split.model} ({100 * split.descriptor_share:.0f}%)" for split in splits if split}
    by_count = "" if all(split and split.same_mechanism for split in splits) else ", by count"
    return ", ".join(sorted(shown)) + by_count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setting", nargs="+", action="append", required=True, metavar=("NAME", "FOLDER"),
                        help="a setting's name, then the sweep folders of its privacy levels and of its run without privacy")  # fmt: skip
    parser.add_argument("--out", type=Path, required=True, help="the Markdown tables")
    parser.add_argument("--figures", type=Path, default=None, help="folder for one metric-against-epsilon figure per setting")
    args = parser.parse_args(argv)
    if any(len(given) < 2 for given in args.setting):
        parser.error("--setting NAME FOLDER [FOLDER ...]: give the setting's name and at least one folder")
    lines = [
        "<!-- generated by: python -m studies.privacy_grouping "
        + " ".join("--setting " + " ".join(given) for given in args.setting)
        + f" --out {args.out}" + (f" --figures {args.figures}" if args.figures else "") + " -->",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    notes, figures = [], []
    for name, *folders in args.setting:
        setting_lines = privacy_lines(setting_runs([Path(folder) for folder in folders]))
        several = len({line.setting for line in setting_lines}) > 1  # the folders hold more than one setting
        for line in setting_lines:
            lines += level_rows(f"{name}: {line.setting}" if several else name, line)
        lines += reference_rows(name, setting_lines)
        notes += [note for note in (cohort_note(setting_lines), missing_note(name, setting_lines)) if note]
        drawn = [line for line in setting_lines if len(line.private_levels) >= MIN_PRIVATE_LEVELS]
        if args.figures is not None and drawn:
            args.figures.mkdir(parents=True, exist_ok=True)
            figures.append(epsilon_figure(drawn, args.figures / f"privacy-{file_part(name)}.png", name))
    lines += [
        "",
        "Final round, mean ± sample std over the seeds; accuracies in %, ARI against the planted groups x100 (the groups "
        "each method's clients are in at the final round: HDC-FL's last refresh, IFCA's and FedSoft's cluster choices). "
        "epsilon reached: by the RDP accountant at the runs' delta (the manifest's privacy.epsilon_rdp), the guarantee; "
        "target: privacy.target_epsilon, from which each run chose z for its planned releases. 'diff. vs no DP per seed' is "
        f"the private run minus the run without privacy of the same seed. Verdict of the private level against no DP: {RULE}. "
        "releases: the noised releases the run composed, split by the rule of analysis/privacy_releases.py (HDC-FL: one model "
        "release a round; at each refresh the releases on the head sketches (the mean sketch, the seeding or a Lloyd step, "
        "the Lloyd steps) as descriptors and one model release, the groups' sums; the other methods: model releases only); "
        "groups at the final round: '(collapsed: one group)' where every seed ends with one group, '(lost: ARI at most 0 at "
        "every seed)' where the groups found say nothing of the planted ones at any seed; a mean accuracy marked '(still "
        f"rising: ...)': {RISING_RULE}; where a run's releases share one z and q (every cell not marked "
        "'by count') each adds the same Renyi divergence, so the descriptor share is also the share of the RDP budget. "
        "*reference* rows: the trivial references the runs recorded (each client's own majority class, or the pooled one, "
        "scored on its test set).",
    ]
    if notes:
        lines += ["", "Notes: " + "; ".join(dict.fromkeys(notes)) + "."]  # a note said of two settings once
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    for path in figures:
        print(f"wrote {path}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
