"""The method a scenario names, built from its own `algorithm.<name>` section."""

from __future__ import annotations

from hdcfl_ray.algorithms.registry import build_method
from hdcfl_ray.config.schema import Scenario
from hdcfl_ray.contract import Method, RunInfo
from hdcfl_ray.data.partitions.newcomers import scenario_newcomers


def build_algorithm(scenario: Scenario) -> Method:
    name = scenario.algorithm.name
    params = getattr(scenario.algorithm, name, None)
    return build_method(name, params, run_info(scenario))


def run_info(scenario: Scenario) -> RunInfo:
    """What a method may know about the run of `scenario` when it is built."""
    return RunInfo(
        seed=scenario.seed,
        rounds=scenario.protocol.rounds,
        server_optimizer=scenario.protocol.server_optimizer,
        client_optimizer=scenario.protocol.optimizer,
        newcomers=scenario_newcomers(scenario),
    )
