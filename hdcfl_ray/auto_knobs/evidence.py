"""Whether a kept choice is what its own evidence says: a cache entry's `choice.json` is
a file anyone can edit, so before a run takes its value the record is checked against
the rule and against the candidate runs kept beside it.

A record passes when every value in it is a number, the chosen value is one the choice
tried, the rule (selection.py) picks it from the record's own candidate and finalist
scores, and each scored candidate's run folder is in the entry, completed, run with its
value, and scored as the record says. Anything else is a problem, described in words
(the file, what is wrong) for the notice that the choice is made again."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hdcfl_ray.auto_knobs.record import AutoKnobsRecord, Candidate, KnobChoice, means_over_draws
from hdcfl_ray.auto_knobs.selection import finalists_pick, first_rung_pick

# the rounds table's floats survive the JSON record exactly; a tolerance only forgives formatting
_SCORE_TOLERANCE = 1e-9


def scored_folder(run_dir: Path, error: str | None) -> tuple[float, int]:
    """A candidate folder's score (its last evaluated round's mean accuracy: on the
    held-out images; NaN without one) and the samples it trained."""
    from hdcfl_ray.logs.table_writer import read_table

    try:
        rows = read_table(run_dir, "rounds").to_pylist()
    except Exception:  # a run that failed before its first round wrote nothing
        rows = []
    evaluated = [row for row in rows if row.get("evaluated")]
    final = max(evaluated, key=lambda row: row["round"]) if evaluated and error is None else {}
    score = final.get("mean_accuracy")
    samples = sum(int(row.get("samples_trained") or 0) + int(row.get("eval_samples_trained") or 0) for row in rows)
    return (float(score) if isinstance(score, (int, float)) else math.nan), samples


def expected_choice(knob: KnobChoice) -> Any:
    """The value the rule picks from the record's own scores: the finalists' best mean over
    their draws where they have one, else rung 1's best score."""
    roots = {c.value: c.same_run_as if c.same_run_as is not None else c.value for c in knob.candidates}
    if knob.finalists:
        picked = finalists_pick(means_over_draws(knob.finalists), roots)
        if picked is not None:
            return picked
    return first_rung_pick({c.value: c.validation_mean_accuracy for c in knob.candidates}, roots)


def record_problems(record: AutoKnobsRecord, entry: Path) -> list[str]:
    """What is wrong with `record` as the choice kept in `entry` ([] when nothing is)."""
    problems: list[str] = []
    for knob in record.knobs:
        problems += _knob_problems(record.method, knob, entry)
    return problems


def _knob_problems(method: str, knob: KnobChoice, entry: Path) -> list[str]:
    values = [knob.chosen, *knob.grid, *knob.extended, *(c.value for c in _scored_runs(knob))]
    not_numbers = [value for value in values if not _is_number(value)]
    if not_numbers:
        return [f"{knob.key}: {', '.join(repr(v) for v in not_numbers[:3])} is not a number"]
    tried = {candidate.value for candidate in knob.candidates}
    if knob.chosen not in tried:
        shown = ", ".join(f"{value:g}" for value in sorted(tried))
        return [f"{knob.key}: chosen {knob.chosen:g} was never tried (the candidates were {shown or 'none'})"]
    expected = expected_choice(knob)
    if expected != knob.chosen:
        picked = "no value" if expected is None else f"{expected:g}"
        return [f"{knob.key}: chosen {knob.chosen:g}, but the rule picks {picked} from the record's own scores"]
    return [problem for candidate in _scored_runs(knob) if (problem := _folder_problem(method, knob, candidate, entry))]


def _scored_runs(knob: KnobChoice) -> Iterator[Candidate]:
    yield from knob.candidates
    yield from knob.finalists


def _folder_problem(method: str, knob: KnobChoice, candidate: Candidate, entry: Path) -> str | None:
    """Why `candidate`'s run folder does not back the record (None: it does)."""
    from hdcfl_ray.logs.manifest import read_manifest

    if candidate.error is not None:
        return None  # a failed candidate is never chosen; its folder may be gone
    name = Path(candidate.run_dir).name
    # looked up by name in the entry, so that a cache folder moved whole stays valid
    folder = entry / name
    shown = f"{knob.key} = {candidate.value:g}{'' if candidate.draw is None else f' (finalist, draw {candidate.draw + 1})'}"
    try:
        manifest = read_manifest(folder) if name else None
    except Exception:
        manifest = None
    if manifest is None or manifest.get("status") != "completed":
        return f"{shown}: its run folder {name or '(none recorded)'} is missing or unfinished"
    if not candidate.replayed and candidate.same_run_as is None:
        ran_with = _written_value(folder, method, knob.field)
        if ran_with is not None and ran_with != candidate.value:
            return f"{shown}: its run folder {name} ran with {ran_with!r}"
    score, _ = scored_folder(folder, None)
    recorded = candidate.validation_mean_accuracy
    if math.isnan(score) != math.isnan(recorded) or (not math.isnan(score) and abs(score - recorded) > _SCORE_TOLERANCE):
        return f"{shown}: the record says {_percent(recorded)} but its run folder {name} scored {_percent(score)}"
    return None


def _written_value(folder: Path, method: str, field: str) -> Any:
    """The knob's value in a candidate folder's scenario.yaml (None: not readable there)."""
    from hdcfl_ray.config.safe_yaml import load_yaml

    try:
        written = load_yaml((folder / "scenario.yaml").read_text(encoding="utf-8"))
        return written["algorithm"][method][field]
    except Exception:
        return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _percent(score: float) -> str:
    return "no score" if math.isnan(score) else f"{100 * score:.2f}%"
