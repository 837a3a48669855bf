"""The paired table: a reference method minus every other method, seed by seed.

Runs with the same seed share the partition and the initialisation, so their
differences are paired. Each method is paired on the seeds it shares with the
reference in that setting, and the table says so wherever that is fewer than the
setting's runs have: such a pair is flagged, a method with no shared seed gets a
row saying it was not paired and why, and a setting without a run of the
reference is named in the note with the methods it leaves unpaired. A reader
therefore sees every method the report holds, compared or not."""

from __future__ import annotations

from analysis.final_metrics import RunMetrics
from analysis.provenance import mark_across_machines
from analysis.report_table import ReportTable, Text
from analysis.row_flags import evidence_flags, flag_name, flag_note, row_flags
from analysis.verdict import RULE, paired_verdict

PAIRED_METRICS = (("mean_accuracy", "mean"), ("worst_accuracy", "worst"), ("bottom20_accuracy", "bot.20%"))
NOT_PAIRED = "not paired"
# the evidence flags of either side that a difference inherits (the seeds are the pair's own)
_EITHER_SIDE = ("sampled evaluation", "pinned for another setting")


def _seeds(seeds: list[int]) -> str:
    return " / ".join(map(str, seeds))


def paired_table(records: list[RunMetrics], reference: str = "hdcfl") -> ReportTable | None:
    """`reference` minus every other method of each setting the reference ran, on the seeds
    both ran; None when the reference has no run or no other method does."""
    by_key = {(r.setting, r.method, r.seed): r for r in records}
    seeds_of: dict[tuple[str, str], list[int]] = {}
    for record in records:
        seeds_of.setdefault((record.setting, record.method), []).append(record.seed)
    flags = row_flags(records)
    table = ReportTable(
        f"Paired differences: {reference} minus each method, per seed (pp)",
        ["Setting", "Method", "Seeds", *(f"Diff.: {label}" for _, label in PAIRED_METRICS), "Seeds with mean diff. > 0",
         f"{reference}: " + " / ".join(label for _, label in PAIRED_METRICS)],
    )
    unpaired_settings = []
    for setting in sorted({r.setting for r in records}):
        others = sorted({method for s, method in seeds_of if s == setting} - {reference})
        reference_seeds = sorted(seeds_of.get((setting, reference), []))
        most_seeds = max(len(seeds) for (s, _), seeds in seeds_of.items() if s == setting)
        if not reference_seeds:
            if others:
                unpaired_settings.append(f"{setting} ({', '.join(others)})")
            continue
        for method in others:
            own_seeds = sorted(seeds_of[(setting, method)])
            shared = [seed for seed in reference_seeds if seed in own_seeds]
            if not shared:
                reason = f"{NOT_PAIRED}: no seed in common ({reference}: {_seeds(reference_seeds)}; {method}: {_seeds(own_seeds)})"
                table.rows.append([Text(setting), Text(method), Text("-"), *(Text("-") for _ in PAIRED_METRICS), Text("-"), Text(reason)])
                continue
            marks = _evidence(flags, setting, reference, method)
            if len(shared) < most_seeds:  # fewer than the reference has, or than the setting's other runs have
                marks.insert(0, f"paired on fewer seeds ({len(shared)} of {most_seeds})")
            row = [Text(setting), Text(method, flags=tuple(marks)), Text(_seeds(shared))]
            positive, verdicts = 0, []
            pairs = [(by_key[(setting, reference, seed)].provenance, by_key[(setting, method, seed)].provenance) for seed in shared]
            for metric, _ in PAIRED_METRICS:
                diffs = [
                    100.0 * (by_key[(setting, reference, seed)].values[metric] - by_key[(setting, method, seed)].values[metric])
                    for seed in shared
                ]
                if metric == "mean_accuracy":
                    positive = sum(diff > 0 for diff in diffs)
                row.append(Text(" / ".join(f"{diff:+.2f}" for diff in diffs)))
                verdicts.append(mark_across_machines(paired_verdict(diffs), pairs))
            row += [Text(f"{positive} of {len(shared)}"), Text(" / ".join(verdicts))]
            table.rows.append(row)
    if not table.rows:
        return None
    notes = [
        (f"Each cell lists {reference}'s final score minus the method's, seed by seed in the order of the Seeds column: "
         f"the seeds both ran in that setting. Verdict of {reference} against the method, per metric: {RULE}.")
    ]
    if any(row[-1].value.startswith(NOT_PAIRED) for row in table.rows):
        notes.append(f"A row '{NOT_PAIRED}' is a method with no seed in common with {reference} in that setting: nothing compares them.")
    if unpaired_settings:
        notes.append(f"Not in this table (no run of {reference} in the setting): " + "; ".join(unpaired_settings) + ".")
    notes.append(flag_note(row[1].flags for row in table.rows))
    table.note = " ".join(note for note in notes if note)
    return table


def _evidence(flags: dict[tuple[str, str], list[str]], setting: str, reference: str, method: str) -> list[str]:
    """The sampled-evaluation and pinned-knob marks of both sides of a pair (the seed counts
    are the pair's own): one mark when both sides are alike, else each side's, the reference's named."""
    own, theirs = ([flag for flag in evidence_flags(flags.get((setting, side))) if flag_name(flag) in _EITHER_SIDE]
                   for side in (method, reference))  # fmt: skip
    if own and own == theirs:
        return [f"{flag} for both" for flag in own]
    return own + [f"{flag} for {reference}" for flag in theirs]
