"""What choosing a run's `auto` knobs will do, before anything trains: which knobs
of the running method are `auto`, the values each may take, the schedule of the
candidate runs and the scenario of each candidate.

The schedule is successive halving, in two rungs:

1. every value runs `max(3, ceil(0.4 x protocol.rounds))` rounds (all of them when the
   run has fewer): long enough for clusters to form and the values to separate, short
   enough that a grid of them costs a few runs;
2. the better half of the values (at least two, and every value tied with the last of
   them: an exact tie never cuts a value on its place in the grid) run the whole schedule, each on
   FINALIST_DRAWS draws of the held-out share, and the best mean over the draws is
   chosen: a value is judged where the run will use it, on more held-out images than
   one draw holds.

Every candidate holds out a fifth of each client's training images, per class
(`partition.validation_fraction: 0.2`, the `hdcfl-ray calibrate` default; a run that
already holds out a share keeps its own), which it is scored on: the test split is
never read."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hdcfl_ray.config.schema import Scenario, method_params
from hdcfl_ray.contract import AUTO, AutoKnob, MethodSpec
from hdcfl_ray.contract.method import AutoValue
from hdcfl_ray.errors import ScenarioError

ROUNDS_SHARE = 0.4  # of protocol.rounds, rounded up
MIN_ROUNDS = 3  # fewer leaves the clustered methods no round after forming their groups
VALIDATION_FRACTION = 0.2  # hdcfl-ray calibrate's default (hdcfl_ray/sweeps/calibration.py)
FINALIST_DRAWS = 2  # held-out draws each finalist runs the whole schedule on (partition.validation_draw 0, 1, ...)
MIN_FINALISTS = 2  # rung 2 keeps the better half of the values, and at least this many


def finalists(values: int) -> int:
    """How many of `values` distinct candidate runs go on to the whole schedule."""
    return min(values, max(MIN_FINALISTS, math.ceil(values / 2)))


@dataclass(frozen=True)
class KnobPlan:
    key: str  # the dotted scenario key, e.g. algorithm.pacfl.threshold
    field: str  # the key inside the method's section, e.g. threshold
    candidates: tuple[AutoValue, ...]  # the grid's values this run can use, in the grid's order
    skipped: tuple[tuple[AutoValue, str], ...]  # (value, why) for the grid's values it cannot
    placeholder: AutoValue | None  # its value while a knob before it is chosen
    server_side: bool = False  # scored on replays of one candidate (AutoKnob.server_side)
    same_run: bool = False  # values the method declares one run train once (AutoKnob.same_run_key)


@dataclass(frozen=True)
class AutoPlan:
    method: str
    knobs: tuple[KnobPlan, ...]  # in the order they are chosen
    rounds: int  # each candidate's rounds in rung 1
    full_rounds: int  # the run's own protocol.rounds: a finalist's rounds
    validation_fraction: float
    draws: int = FINALIST_DRAWS  # held-out draws each finalist is scored on

    @property
    def candidate_runs(self) -> int:
        """The candidate runs that train, at most (a value beyond a grid's edge adds one)."""
        return sum(len(self.runs_of(knob)) for knob in self.knobs)

    def runs_of(self, knob: KnobPlan) -> list[int]:
        """The rounds of each run `knob`'s choice trains, at most: rung 1's, then the finalists'
        (a finalist's first draw is rung 1's run when the schedule is not shortened)."""
        first = [self.rounds] * (1 if knob.server_side else len(knob.candidates))
        finalist_runs = 1 if knob.server_side else finalists(len(knob.candidates))
        if len(knob.candidates) < 2:
            return first
        return [*first, *[self.full_rounds] * (finalist_runs * self.finalist_draws_to_train)]

    @property
    def finalist_draws_to_train(self) -> int:
        """The draws a finalist trains (draw 0 is rung 1's run when the schedule is not shortened)."""
        return self.draws - (1 if self.rounds == self.full_rounds else 0)

    def describe(self) -> list[str]:
        """One line per knob, for `hdcfl-ray validate` and the start of a run."""
        lines = []
        for knob in self.knobs:
            values = ", ".join(f"{value:g}" for value in knob.candidates)
            skipped = f" ({', '.join(f'{value:g}' for value, _ in knob.skipped)} skipped)" if knob.skipped else ""
            runs = f"one run of {self.rounds} of {self.full_rounds} rounds per value"
            if knob.server_side:
                runs = f"one run of {self.rounds} of {self.full_rounds} rounds, the other values scored on replays of its refreshes"
            elif knob.same_run:
                runs += " (values that give the same run run once)"
            if len(knob.candidates) > 1:
                runs += f", then the better half the whole {self.full_rounds} rounds on {self.draws} held-out draws"
            lines.append(
                f"{knob.key}: auto: chosen before the run among {values}{skipped}, {runs}, on a "
                f"{self.validation_fraction:g} share of each client's training samples held out (never the test set)"
            )
        return lines


def short_rounds(rounds: int) -> int:
    """The rounds of a candidate run of a run of `rounds` rounds."""
    return min(rounds, max(MIN_ROUNDS, math.ceil(ROUNDS_SHARE * rounds)))


def auto_plan(scenario: Scenario) -> AutoPlan | None:
    """The plan for the running method's `auto` knobs; None when it has none. A knob
    none of whose values this run can use is bad input (ScenarioError)."""
    from hdcfl_ray.algorithms.registry import method_spec

    spec = method_spec(scenario.algorithm.name)
    params = method_params(scenario.algorithm)
    declared = [knob for knob in spec.auto_knobs if getattr(params, knob.key) == AUTO]
    if not declared:
        return None
    knobs = tuple(_knob_plan(scenario, spec.name, knob, params) for knob in declared)
    validation = scenario.partition.validation_fraction
    return AutoPlan(
        method=spec.name,
        knobs=knobs,
        rounds=short_rounds(scenario.protocol.rounds),
        full_rounds=scenario.protocol.rounds,
        validation_fraction=validation if validation is not None else VALIDATION_FRACTION,
    )


def _knob_plan(scenario: Scenario, method: str, knob: AutoKnob, params: Any) -> KnobPlan:
    key = f"algorithm.{method}.{knob.key}"
    num_clients = scenario.partition.num_clients
    usable: list[AutoValue] = []
    skipped: list[tuple[AutoValue, str]] = []
    for value in knob.candidates(params):
        if knob.counts_models and value > num_clients:
            skipped.append((value, f"{value:g} models for {num_clients} clients"))
            continue
        problem = _refused(scenario, {knob.key: value})
        if problem is not None:
            skipped.append((value, problem))
        else:
            usable.append(value)
    if not usable:
        reasons = "; ".join(f"{value:g}: {why}" for value, why in skipped)
        raise ScenarioError(f"{key}: auto: no value of its grid can run on this scenario ({reasons}); give it a value")
    return KnobPlan(key, knob.key, tuple(usable), tuple(skipped), knob.placeholder, knob.server_side, knob.same_run_key is not None)


def _refused(scenario: Scenario, values: dict[str, AutoValue]) -> str | None:
    """Why the method refuses `values` in this scenario (its check, its build), or None.
    The method's other auto knobs stand at a value they may take."""
    from hdcfl_ray.config.methods import build_algorithm

    try:
        resolved = with_values(scenario, {**stand_ins(scenario), **values})
        build_algorithm(resolved)
    except (ScenarioError, ValueError) as error:
        return str(error).splitlines()[-1].strip()
    return None


def stand_ins(scenario: Scenario) -> dict[str, AutoValue]:
    """A value for each auto knob of the running method that it may take: its
    placeholder, else its grid's first value (what the checks that build the method
    before the choice is made build it with)."""
    from hdcfl_ray.algorithms.registry import method_spec

    return stand_in_values(method_spec(scenario.algorithm.name), method_params(scenario.algorithm))


def stand_in_values(spec: MethodSpec, params: Any) -> dict[str, AutoValue]:
    """`stand_ins` for a method's section `params`."""
    return {
        knob.key: knob.placeholder if knob.placeholder is not None else knob.candidates(params)[0]
        for knob in spec.auto_knobs
        if getattr(params, knob.key) == AUTO
    }


def largest_candidate(spec: MethodSpec, params: Any, field: str) -> AutoValue:
    """The largest value of `field`'s grid (the memory check counts the most cluster
    models a candidate may keep)."""
    knob = next(knob for knob in spec.auto_knobs if knob.key == field)
    return max(knob.candidates(params))


def with_values(scenario: Scenario, values: dict[str, AutoValue]) -> Scenario:
    """`scenario` with these keys of the running method's section set (validated as a
    scenario file would be)."""
    from hdcfl_ray.config.loading import build_scenario

    raw = scenario.model_dump(mode="json")
    name = scenario.algorithm.name
    raw["algorithm"][name] = {**(raw["algorithm"].get(name) or {}), **values}
    return build_scenario(raw, source=f"algorithm.{name} with {', '.join(f'{key}={value:g}' for key, value in values.items())}")


def candidate_scenario(
    scenario: Scenario, plan: AutoPlan, values: dict[str, AutoValue], keep_refreshes: bool = False, finalist_draw: int | None = None
) -> Scenario:
    """The validation-scored run of `scenario` with the auto knobs at `values`: rung 1's
    shortened one, or with `finalist_draw` a finalist's whole schedule on that draw of
    the held-out share; on the local backend, without checkpoints or trackers, and without
    refresh caches unless `keep_refreshes` (a knob scored on replays of them); a candidate
    is evidence for one choice, not a run of its own. A method whose schedule counts
    rounds keeps it inside a shortened candidate's (MethodSpec.shortened)."""
    from hdcfl_ray.algorithms.registry import method_spec
    from hdcfl_ray.config.loading import build_scenario

    resolved = with_values(scenario, values)
    raw = resolved.model_dump(mode="json")
    rounds = plan.rounds if finalist_draw is None else plan.full_rounds
    raw["protocol"]["rounds"] = rounds
    raw["partition"]["validation_fraction"] = plan.validation_fraction
    raw["partition"]["validation_draw"] = finalist_draw or 0
    raw["runtime"]["backend"] = "local"
    raw["checkpoint"]["every"] = None
    raw["output"].update(save_refresh_cache=keep_refreshes, trackers=[], label=None)
    spec = method_spec(plan.method)
    if spec.shortened is not None and rounds < plan.full_rounds:
        name = scenario.algorithm.name
        shortened = spec.shortened(method_params(resolved.algorithm), rounds)
        raw["algorithm"][name] = shortened.model_dump(mode="json")
    which = "finalist" if finalist_draw is not None else "candidate"
    return build_scenario(raw, source=f"the auto-knob {which} {', '.join(f'{key}={value:g}' for key, value in values.items())}")


def check_validation_split(scenario: Scenario, plan: AutoPlan, dataset: Any) -> None:
    """Stop (ScenarioError) before anything runs when the candidates cannot hold out
    their share of each client's training images (a client with too few)."""
    from hdcfl_ray.data.partitions import partition_dataset

    if scenario.partition.validation_fraction is not None:
        return  # the run holds out its own share, checked when its partition was built
    config = scenario.partition.model_copy(update={"validation_fraction": plan.validation_fraction})
    try:
        partition_dataset(config, dataset, scenario.seed)
    except (ScenarioError, ValueError) as error:
        keys = ", ".join(knob.key for knob in plan.knobs)
        raise ScenarioError(
            f"{keys}: auto is chosen on {plan.validation_fraction:g} of each client's training samples held out, "
            f"which this partition cannot spare ({error}); give {'it a value' if len(plan.knobs) == 1 else 'them values'}"
        ) from None
