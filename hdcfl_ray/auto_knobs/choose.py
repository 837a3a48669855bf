"""Choosing a run's auto knobs: knob after knob in the method's order, one shortened,
validation-scored candidate run per value (plan.py), the value the rule picks
(selection.py) kept, the choice written to the cache (cache.py) for the next run of
the same setting and seed. The candidates run through the driver like any run (it
passes the `Runner`, which reuses the run's loaded dataset), into folders of the
cache entry."""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hdcfl_ray.auto_knobs.cache import cache_key, entry_dir, entry_lock, read_choice, write_choice
from hdcfl_ray.auto_knobs.plan import AutoPlan, KnobPlan, candidate_scenario
from hdcfl_ray.auto_knobs.record import AutoKnobsRecord, Candidate, KnobChoice
from hdcfl_ray.auto_knobs.selection import RULE, choose
from hdcfl_ray.config.schema import Scenario
from hdcfl_ray.contract.method import AutoValue
from hdcfl_ray.errors import ScenarioError, failure_text

Notify = Callable[[str], None]
Runner = Callable[[Scenario, Path], None]  # runs a scenario into a new run folder


def choose_auto_knobs(scenario: Scenario, plan: AutoPlan, root: Path, notify: Notify, run: Runner) -> AutoKnobsRecord:
    """The choice for a run of `scenario` (as written): from the cache when it holds
    one, else made now, its candidates run by `run`, and cached."""
    key = cache_key(scenario, plan)
    entry = entry_dir(root, key)
    cached = read_choice(entry, key)
    if cached is None:
        with entry_lock(entry):
            cached = read_choice(entry, key)  # made by another run while this one waited
            if cached is None:
                record = _choose(scenario, plan, entry, notify, run)
                write_choice(entry, key, record)
                return record
    record = cached.from_the_cache()
    chosen = ", ".join(f"{knob.key} = {knob.chosen:g}" for knob in record.knobs)
    notify(f"auto: {chosen}, chosen earlier for this setting and seed ({entry / 'choice.json'}; delete it to choose again)")
    return record


def _choose(scenario: Scenario, plan: AutoPlan, entry: Path, notify: Notify, run: Runner) -> AutoKnobsRecord:
    started = time.perf_counter()
    chosen: dict[str, AutoValue] = {}
    knobs: list[KnobChoice] = []
    for index, knob in enumerate(plan.knobs):
        # the knobs chosen before this one at their choice, those after it at their placeholder
        held = {**chosen, **{later.field: later.placeholder for later in plan.knobs[index + 1 :]}}
        knobs.append(_choose_knob(scenario, plan, knob, held, entry, notify, run))
        chosen[knob.field] = knobs[-1].chosen
    elapsed = time.perf_counter() - started
    record = AutoKnobsRecord(
        method=plan.method,
        rule=RULE,
        rounds=plan.rounds,
        full_rounds=plan.full_rounds,
        validation_fraction=plan.validation_fraction,
        knobs=tuple(knobs),
        cache=str(entry),
        from_cache=False,
        elapsed_s=round(elapsed, 3),
    )
    notify(f"auto: chose {', '.join(f'{knob.key} = {knob.chosen:g}' for knob in knobs)} in {elapsed:.0f} s "
           f"({record.samples_trained:,} samples trained); the run starts now")
    return record


def _choose_knob(
    scenario: Scenario, plan: AutoPlan, knob: KnobPlan, held: dict[str, Any], entry: Path, notify: Notify, run: Runner
) -> KnobChoice:
    shown_held = f" (with {', '.join(f'{field} {value:g}' for field, value in held.items())})" if held else ""
    notify(
        f"{knob.key}: auto: choosing among {', '.join(f'{value:g}' for value in knob.candidates)}{shown_held}: "
        f"{len(knob.candidates)} runs of {plan.rounds} rounds, scored on a {plan.validation_fraction:g} share of each "
        "client's training images held out"
    )
    candidates = []
    for position, value in enumerate(knob.candidates, start=1):
        started = time.perf_counter()
        candidate = run_candidate(candidate_scenario(scenario, plan, {**held, knob.field: value}), value, entry / f"{knob.field}-{value:g}", run)
        candidates.append(candidate)
        score = candidate.validation_mean_accuracy
        outcome = f"validation mean {100 * score:.2f}%" if not math.isnan(score) else "no score, not chosen"
        if candidate.error:
            outcome = f"failed, not chosen ({candidate.error})"
        notify(f"{knob.key} = {value:g} ({position}/{len(knob.candidates)}): {outcome} ({time.perf_counter() - started:.0f} s)")
    value = choose([(candidate.value, candidate.validation_mean_accuracy) for candidate in candidates])
    if value is None:
        raise RuntimeError(f"{knob.key}: auto: no candidate run ended with a score (see {entry}); give the knob a value")
    return KnobChoice(
        key=knob.key,
        grid=knob.candidates,
        skipped={f"{value:g}": why for value, why in knob.skipped},
        held={f"algorithm.{plan.method}.{field}": held_value for field, held_value in held.items()},
        candidates=tuple(candidates),
        chosen=value,
    )


def run_candidate(scenario: Scenario, value: AutoValue, run_dir: Path, run: Runner) -> Candidate:
    """The candidate run of `scenario` into `run_dir` (a completed one already there for
    the same scenario, left by an interrupted choice, is reused), and its score and cost."""
    from hdcfl_ray.config.loading import scenario_to_yaml
    from hdcfl_ray.logs.manifest import read_manifest
    from hdcfl_ray.logs.table_writer import read_table

    try:
        manifest = read_manifest(run_dir)
        written = (run_dir / "scenario.yaml").read_text(encoding="utf-8") if manifest is not None else None
    except (ScenarioError, OSError):  # damaged: the candidate runs again
        manifest, written = None, None
    reusable = manifest is not None and manifest.get("status") == "completed" and written == scenario_to_yaml(scenario)
    error = None
    if not reusable:
        if run_dir.exists():
            shutil.rmtree(run_dir)  # an unfinished candidate: checkpoints are off, so it starts again
        try:
            run(scenario, run_dir)
        except Exception as failure:  # a value the run cannot train with is not chosen; the others still compete
            error = failure_text(failure)
    rows = read_table(run_dir, "rounds").to_pylist()
    evaluated = [row for row in rows if row.get("evaluated")]
    final = max(evaluated, key=lambda row: row["round"]) if evaluated and error is None else {}
    score = final.get("mean_accuracy")
    samples = sum(int(row.get("samples_trained") or 0) + int(row.get("eval_samples_trained") or 0) for row in rows)
    return Candidate(
        value=value,
        validation_mean_accuracy=float(score) if isinstance(score, (int, float)) else math.nan,
        samples_trained=samples,
        run_dir=str(run_dir),
        error=error,
    )
