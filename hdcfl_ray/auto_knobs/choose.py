"""Choosing a run's auto knobs: knob after knob in the method's order, by successive
halving (plan.py): one shortened, validation-scored candidate run per value, then the
better half of the values over the whole schedule on several draws of the held-out
share; the value the rule picks (selection.py) from the finalists' mean is kept, and
the choice written to the cache (cache.py) for the next run of the same setting, data,
code and seed. The candidates run through the driver like any
run (it passes the `Runner`, which reuses the run's loaded dataset), into folders of
the cache entry.

What a candidate costs is kept to what tells the values apart:

* values a method declares to give the same run (`AutoKnob.same_run_key`, read off the
  method's state after round 1's probes: PACFL's thresholds that cut the clients into
  the same clusters) run once, and the others take its score;
* values that change nothing a client trains (`AutoKnob.server_side`: HDC-FL's groups)
  are scored on replays of one candidate's saved refreshes;
* a choice at the edge of its grid runs the value one step beyond it where the method
  says that means something (`AutoKnob.beyond`), once: after the first rung, or after the
  finalists (then as a finalist too), and is recorded at the edge when it stays there.

A choice with a failed candidate is not cached: the next run tries that value again."""

from __future__ import annotations

import math
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from hdcfl_ray.auto_knobs.cache import cache_key, choice_code, entry_dir, entry_lock, not_used_notice, read_choice, write_choice
from hdcfl_ray.auto_knobs.plan import AutoPlan, KnobPlan, candidate_scenario
from hdcfl_ray.auto_knobs.record import AutoKnobsRecord, Candidate, KnobChoice, means_over_draws
from hdcfl_ray.auto_knobs.evidence import scored_folder as _scored
from hdcfl_ray.auto_knobs.selection import RULE, better_half, finalists_pick, first_rung_pick
from hdcfl_ray.config.schema import Scenario, method_params
from hdcfl_ray.contract.method import AutoKnob, AutoValue
from hdcfl_ray.errors import ScenarioError, failure_text

Notify = Callable[[str], None]
Runner = Callable[[Scenario, Path], None]  # runs a scenario into a new run folder
# the method's server state after round 1's probes, for a scenario (runtime/backends/local_host.py)
Prober = Callable[[Scenario], Any]


def choose_auto_knobs(
    scenario: Scenario, plan: AutoPlan, root: Path, notify: Notify, run: Runner, probe: Prober | None = None, data: str | None = None
) -> AutoKnobsRecord:
    """The choice for a run of `scenario` (as written): from the cache when it holds
    one, else made now, its candidates run by `run`, and cached unless a candidate
    failed. `data` is the digest of the loaded dataset (auto_knobs/digests.py)."""
    key = cache_key(scenario, plan, data)
    entry = entry_dir(root, key)
    cached, problem = read_choice(entry, key)
    if cached is None:
        with entry_lock(entry):
            cached, problem = read_choice(entry, key)  # made by another run while this one waited
            if cached is None:
                if problem is not None:
                    notify(not_used_notice(entry, problem))
                record = replace(_choose(scenario, plan, entry, notify, run, probe), code=choice_code(key))
                failed = [
                    c for knob in record.knobs for c in (*knob.candidates, *knob.finalists) if c.error is not None and c.same_run_as is None
                ]
                if failed:
                    notify(f"auto: not kept for the next run: {len(failed)} candidate(s) failed, and will be tried again then")
                else:
                    write_choice(entry, key, record)
                return record
    # an entry written before records kept their code was made by this code all the same: the key holds it
    record = replace(cached, code=cached.code or choice_code(key)).from_the_cache()
    chosen = ", ".join(f"{knob.key} = {knob.chosen:g}" for knob in record.knobs)
    notify(f"auto: {chosen}, chosen earlier for this setting, data, code and seed ({entry / 'choice.json'}; delete it to choose again)")
    return record


class _Progress:
    """The candidate runs still to come (their rounds) and the time a round took so far:
    an estimate of what is left."""

    def __init__(self, runs: list[int]) -> None:
        self.left = list(runs)
        self.total = len(runs)
        self.done = 0
        self.seconds_per_round: list[float] = []

    def plan(self, dropped: list[int], added: list[int]) -> None:
        """Runs the plan counted that will not happen, and runs it did not count."""
        for rounds in dropped:
            if rounds in self.left:
                self.left.remove(rounds)
                self.total -= 1
        self.left += added
        self.total += len(added)

    def ran(self, seconds: float, rounds: int, counted: bool, trained: bool) -> str:
        """`counted`: a run the plan counted (a replay is not one)."""
        if counted:
            self.done += 1
            if rounds in self.left:
                self.left.remove(rounds)
        if trained:
            self.seconds_per_round.append(seconds / max(rounds, 1))
        if not self.left or not self.seconds_per_round:
            return ""
        return f"; {self.done}/{self.total} candidate runs, about {sum(self.left) * statistics.median(self.seconds_per_round):.0f} s left"


def _choose(scenario: Scenario, plan: AutoPlan, entry: Path, notify: Notify, run: Runner, probe: Prober | None) -> AutoKnobsRecord:
    from hdcfl_ray.algorithms.registry import method_spec

    started = time.perf_counter()
    spec = method_spec(plan.method)
    declared = {knob.key: knob for knob in spec.auto_knobs}
    chosen: dict[str, AutoValue] = {}
    knobs: list[KnobChoice] = []
    progress = _Progress([rounds for knob in plan.knobs for rounds in plan.runs_of(knob)])
    for index, knob in enumerate(plan.knobs):
        # the knobs chosen before this one at their choice, those after it at their placeholder
        held = {**chosen, **{later.field: later.placeholder for later in plan.knobs[index + 1 :]}}
        knobs.append(_choose_knob(scenario, plan, knob, declared[knob.field], held, entry, notify, run, probe, progress))
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


class _Candidates:
    """One knob's candidates as they are scored: trained, taken from a value that gives the
    same run, or replayed from one trained candidate's saved refreshes."""

    def __init__(self, scenario: Scenario, plan: AutoPlan, knob: KnobPlan, declared: AutoKnob[Any], held: dict[str, Any],
                 entry: Path, run: Runner, probe: Prober | None) -> None:  # fmt: skip
        self.scenario, self.plan, self.knob, self.declared, self.held = scenario, plan, knob, declared, held
        self.entry, self.run, self.probe = entry, run, probe
        self.scored: dict[AutoValue, Candidate] = {}
        self.same_run: dict[AutoValue, AutoValue] = {}  # value -> the value whose run it shares
        self.keys: dict[AutoValue, Any] | None = None
        self.finalists: dict[tuple[AutoValue, int], Candidate] = {}  # (value, draw) -> its whole-schedule run

    def scenario_of(self, value: AutoValue, draw: int | None = None) -> Scenario:
        values = {**self.held, self.knob.field: value}
        return candidate_scenario(self.scenario, self.plan, values, keep_refreshes=self.declared.server_side, finalist_draw=draw)

    def run_key(self, value: AutoValue) -> Any:
        """What tells `value` apart from the others (None: nothing; every value runs)."""
        if self.declared.same_run_key is None or self.probe is None:
            return None
        if self.keys is None:
            self.keys = {}
            self._state = self.probe(self.scenario_of(self.knob.candidates[0]))
        params = method_params(self.scenario_of(value).algorithm)
        return self.declared.same_run_key(params, self._state, value)

    def score(self, value: AutoValue) -> tuple[Candidate, bool]:
        """`value`'s candidate, and whether it trained."""
        key = self.run_key(value)
        if key is not None:
            twin = next((other for other, other_key in (self.keys or {}).items() if other_key == key), None)
            assert self.keys is not None
            self.keys[value] = key
            if twin is not None:
                self.same_run[value] = twin
                return replace(self.scored[twin], value=value, samples_trained=0, same_run_as=twin), False
        folder = self.entry / f"{self.knob.field}-{value:g}"
        trained = [candidate for candidate in self.scored.values() if candidate.samples_trained > 0 and candidate.error is None]
        if self.declared.server_side and trained:
            return replay_candidate(Path(trained[0].run_dir), self.knob.key, value, folder), False
        return run_candidate(self.scenario_of(value), value, folder, self.run), True

    def score_finalist(self, value: AutoValue, draw: int) -> tuple[Candidate, bool]:
        """`value`'s whole-schedule run on held-out draw `draw`, and whether it trained (a
        schedule that was never shortened has run draw 0 in rung 1 already)."""
        if draw == 0 and self.plan.rounds == self.plan.full_rounds:
            return replace(self.scored[value], samples_trained=0, draw=0), False
        folder = self.entry / f"{self.knob.field}-{value:g}-whole-draw{draw}"
        trained = [c for (_, d), c in self.finalists.items() if d == draw and c.samples_trained > 0 and c.error is None]
        if self.declared.server_side and trained:
            return replace(replay_candidate(Path(trained[0].run_dir), self.knob.key, value, folder), draw=draw), False
        return replace(run_candidate(self.scenario_of(value, draw), value, folder, self.run), draw=draw), True

    def root(self, value: AutoValue) -> AutoValue:
        """The value whose run `value` is (itself unless declared the same run as another)."""
        return self.same_run.get(value, value)

    def finalist_values(self) -> list[AutoValue]:
        """Rung 2's values: the better half of the distinct runs with a score, by rung 1's
        score, and those tied with the last of them (selection.better_half), smallest first."""
        return better_half([(value, c.validation_mean_accuracy) for value, c in self.scored.items() if self.root(value) == value])

    def roots(self) -> dict[AutoValue, AutoValue]:
        """{each scored value: the value whose run it is}."""
        return {value: self.root(value) for value in self.scored}


def _choose_knob(
    scenario: Scenario,
    plan: AutoPlan,
    knob: KnobPlan,
    declared: AutoKnob[Any],
    held: dict[str, Any],
    entry: Path,
    notify: Notify,
    run: Runner,
    probe: Prober | None,
    progress: _Progress,
) -> KnobChoice:
    shown_held = f" (with {', '.join(f'{field} {value:g}' for field, value in held.items())})" if held else ""
    how = ("one run, the other values scored on replays of its refreshes" if declared.server_side
           else f"{len(knob.candidates)} runs (values that give the same run run once)")  # fmt: skip
    notify(
        f"{knob.key}: auto: choosing among {', '.join(f'{value:g}' for value in knob.candidates)}{shown_held}: "
        f"{how} of {plan.rounds} rounds, scored on a {plan.validation_fraction:g} share of each client's training samples held out"
    )
    candidates = _Candidates(scenario, plan, knob, declared, held, entry, run, probe)

    def score(value: AutoValue, position: str) -> None:
        started = time.perf_counter()
        candidate, trained = candidates.score(value)
        candidates.scored[value] = candidate
        seconds = time.perf_counter() - started
        how = f"the same run as {candidate.same_run_as:g}" if candidate.same_run_as is not None else ("replayed" if candidate.replayed else f"{seconds:.0f} s")
        counted = not candidate.replayed
        notify(f"{knob.key} = {value:g} ({position}): {_outcome(candidate)} ({how}{progress.ran(seconds, plan.rounds, counted, trained)})")

    def _beyond(value: AutoValue | None, tried: tuple[AutoValue, ...]) -> AutoValue | None:
        """The value one step beyond `tried`'s edge where `value` sits there and the method
        declares one that was neither tried nor skipped, else None."""
        edge = _edge(value, tried)
        if value is None or edge is None or declared.beyond is None:
            return None
        params = method_params(candidates.scenario_of(value).algorithm)
        further = declared.beyond(params, value, edge, scenario.partition.num_clients)
        if further is None or further in candidates.scored or any(v == further for v, _ in knob.skipped):
            return None
        return further

    for position, value in enumerate(knob.candidates, start=1):
        score(value, f"{position}/{len(knob.candidates)}")
    value = _pick(candidates)
    extended: list[AutoValue] = []
    edge = _edge(value, knob.candidates)
    if edge is not None:
        further = _beyond(value, knob.candidates)
        if further is not None:
            progress.plan([], [plan.rounds])
            notify(f"{knob.key}: auto: {value:g} is the grid's {'largest' if edge == 'high' else 'smallest'} value; trying {further:g} beyond it")
            score(further, "beyond the grid")
            extended.append(further)
            value = _pick(candidates)
    if value is None:
        raise RuntimeError(f"{knob.key}: auto: no candidate run ended with a score (see {entry}); give the knob a value")
    final = _final_rung(plan, knob, candidates, notify, progress)
    if final is not None:
        value = final
        # the finalists' choice at the grid's edge looks one step beyond it too, where the first
        # rung did not (one step beyond the grid at most), as a first-rung candidate and, when
        # it scores, as a finalist on every draw
        further = None if extended else _beyond(value, knob.candidates)
        if further is not None:
            if not declared.server_side:  # a server-side knob's values are replays: nothing more trains
                progress.plan([], [plan.rounds, *[plan.full_rounds] * plan.finalist_draws_to_train])
            notify(f"{knob.key}: auto: the finalists chose {value:g}, the grid's {'largest' if value == max(knob.candidates) else 'smallest'} value; trying {further:g} beyond it")
            score(further, "beyond the grid")
            extended.append(further)
            if candidates.root(further) == further and not math.isnan(candidates.scored[further].validation_mean_accuracy):
                _run_finalists(plan, knob, candidates, [further], notify, progress)
                value = _finalists_choice(knob, candidates, notify) or value
    tried = [*knob.candidates, *extended]
    at_edge = _edge(value, tuple(sorted(tried)))
    return KnobChoice(
        key=knob.key,
        grid=knob.candidates,
        skipped={f"{value:g}": why for value, why in knob.skipped},
        held={f"algorithm.{plan.method}.{field}": held_value for field, held_value in held.items()},
        candidates=tuple(candidates.scored[v] for v in sorted(candidates.scored)),
        chosen=value,
        extended=tuple(extended),
        at_edge=at_edge,
        finalists=tuple(candidates.finalists[key] for key in sorted(candidates.finalists)),
    )


def _outcome(candidate: Candidate) -> str:
    if candidate.error:
        return f"failed, not chosen ({candidate.error})"
    if math.isnan(candidate.validation_mean_accuracy):
        return "no score, not chosen"
    return f"validation mean {100 * candidate.validation_mean_accuracy:.2f}%"


def _final_rung(plan: AutoPlan, knob: KnobPlan, candidates: _Candidates, notify: Notify, progress: _Progress) -> AutoValue | None:
    """Rung 2: the better half of rung 1's distinct runs, each over the whole schedule on
    every held-out draw; the value the rule picks from their means (of values that gave the
    same run in rung 1, the middle one), or None when fewer than two values go on."""
    values = candidates.finalist_values()
    planned = plan.runs_of(knob)[1 if knob.server_side else len(knob.candidates) :]
    runs = (1 if knob.server_side else len(values)) * plan.finalist_draws_to_train if len(values) > 1 else 0
    progress.plan(planned, [plan.full_rounds] * runs)
    if len(values) < 2:
        return None
    notify(
        f"{knob.key}: auto: the better half ({', '.join(f'{value:g}' for value in values)}) runs the whole "
        f"{plan.full_rounds} rounds on {plan.draws} draws of the held-out share"
    )
    _run_finalists(plan, knob, candidates, values, notify, progress)
    return _finalists_choice(knob, candidates, notify)


def _run_finalists(
    plan: AutoPlan, knob: KnobPlan, candidates: _Candidates, values: list[AutoValue], notify: Notify, progress: _Progress
) -> None:
    for draw in range(plan.draws):
        for value in values:
            started = time.perf_counter()
            finalist, trained = candidates.score_finalist(value, draw)
            candidates.finalists[(value, draw)] = finalist
            seconds = time.perf_counter() - started
            how = "replayed" if finalist.replayed else ("rung 1's run" if not trained else f"{seconds:.0f} s")
            notify(
                f"{knob.key} = {value:g} (finalist, draw {draw + 1}/{plan.draws}): {_outcome(finalist)} "
                f"({how}{progress.ran(seconds, plan.full_rounds, trained, trained)})"
            )


def _finalists_choice(knob: KnobPlan, candidates: _Candidates, notify: Notify) -> AutoValue | None:
    means = means_over_draws(candidates.finalists.values())
    best = finalists_pick(means, candidates.roots())
    if best is None:
        return None
    notify(f"{knob.key}: auto: means over the draws: {', '.join(f'{v:g} {100 * m:.2f}%' for v, m in sorted(means.items()))}")
    return best


def _edge(value: AutoValue | None, grid: tuple[AutoValue, ...]) -> str | None:
    """'high' or 'low' when `value` is the grid's largest or smallest (None inside it)."""
    if value is None or len(grid) < 2:
        return None
    if value == max(grid):
        return "high"
    if value == min(grid):
        return "low"
    return None


def _pick(candidates: _Candidates) -> AutoValue | None:
    """The rule's value among rung 1's scores; of values that gave the same run, the middle one."""
    scores = {value: candidate.validation_mean_accuracy for value, candidate in candidates.scored.items()}
    return first_rung_pick(scores, candidates.roots())


def replay_candidate(trained_dir: Path, key: str, value: AutoValue, run_dir: Path) -> Candidate:
    """`value` scored on a replay of a trained candidate's saved refreshes (a knob that
    changes nothing the clients train); a replay already there is reused."""
    from hdcfl_ray.ablation.replay import ablate_run
    from hdcfl_ray.logs.manifest import read_manifest

    error = None
    try:
        manifest = read_manifest(run_dir)
    except ScenarioError:
        manifest = None
    if manifest is None or manifest.get("status") != "completed":
        if run_dir.exists():
            shutil.rmtree(run_dir)
        try:
            ablate_run(trained_dir, [f"{key}={value:g}"], run_dir)
        except Exception as failure:
            error = failure_text(failure)
    score, _ = _scored(run_dir, error)
    return Candidate(value=value, validation_mean_accuracy=score, samples_trained=0, run_dir=str(run_dir), error=error, replayed=True)


def run_candidate(scenario: Scenario, value: AutoValue, run_dir: Path, run: Runner) -> Candidate:
    """The candidate run of `scenario` into `run_dir` (a completed one already there for
    the same scenario, left by an interrupted choice, is reused), and its score and cost."""
    from hdcfl_ray.config.loading import scenario_to_yaml
    from hdcfl_ray.logs.manifest import read_manifest

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
    score, samples = _scored(run_dir, error)
    return Candidate(value=value, validation_mean_accuracy=score, samples_trained=samples, run_dir=str(run_dir), error=error)
