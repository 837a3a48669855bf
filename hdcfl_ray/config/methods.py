"""The method a scenario names, built from its own `algorithm.<name>` section."""

from __future__ import annotations

from hdcfl_ray.algorithms.registry import build_method, method_spec
from hdcfl_ray.config.schema import Scenario, method_params
from hdcfl_ray.contract import AUTO, Method, RunInfo


def build_algorithm(scenario: Scenario) -> Method:
    name = scenario.algorithm.name
    params = method_params(scenario.algorithm)
    # a knob set to auto has no value until the run chooses one (run_simulation does)
    unchosen = [knob.key for knob in method_spec(name).auto_knobs if getattr(params, knob.key) == AUTO]
    if unchosen:
        keys = ", ".join(f"algorithm.{name}.{key}" for key in unchosen)
        raise ValueError(
            f"{keys}: auto is chosen when a run starts (hdcfl-ray simulate, hdcfl_ray.simulate, sweeps); "
            "give a value to build the method without a run"
        )
    return build_method(name, params, run_info(scenario))


def run_info(scenario: Scenario) -> RunInfo:
    """What a method may know about the run of `scenario` when it is built."""
    return RunInfo(seed=scenario.seed, rounds=scenario.protocol.rounds)
