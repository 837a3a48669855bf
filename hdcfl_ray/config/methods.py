"""The method a scenario names, built from its own `algorithm.<name>` section."""

from __future__ import annotations

from hdcfl_ray.algorithms.registry import build_method
from hdcfl_ray.config.schema import Scenario
from hdcfl_ray.contract import Method, ResolvedPrivacy, RunInfo
from hdcfl_ray.data.partitions.newcomers import scenario_newcomers


def build_algorithm(scenario: Scenario, privacy: ResolvedPrivacy | None = None) -> Method:
    """The method of `scenario`; a run passes the privacy it resolved (PreparedRun.privacy)."""
    name = scenario.algorithm.name
    params = getattr(scenario.algorithm, name, None)
    return build_method(name, params, run_info(scenario, privacy))


def run_info(scenario: Scenario, privacy: ResolvedPrivacy | None = None) -> RunInfo:
    """What a method may know about the run of `scenario` when it is built (`privacy`: the
    scenario's privacy section as the run resolved it, runtime/privacy_plan.py)."""
    return RunInfo(
        seed=scenario.seed,
        rounds=scenario.protocol.rounds,
        server_optimizer=scenario.protocol.server_optimizer,
        client_optimizer=scenario.protocol.optimizer,
        newcomers=scenario_newcomers(scenario),
        privacy=privacy,
    )
