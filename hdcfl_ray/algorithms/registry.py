"""Scenario `algorithm.name` -> algorithm object."""

from __future__ import annotations

from hdcfl_ray.algorithms.base import Algorithm
from hdcfl_ray.algorithms.fedavg_se import FedAvgSE
from hdcfl_ray.algorithms.hdcfl import HDCFL
from hdcfl_ray.config.schema import Scenario


def build_algorithm(scenario: Scenario) -> Algorithm:
    name = scenario.algorithm.name
    if name == "hdcfl":
        return HDCFL(scenario.algorithm.hdcfl, rounds=scenario.protocol.rounds, seed=scenario.seed)
    if name == "fedavg_se":
        return FedAvgSE()
    raise ValueError(f"algorithm.name: {name!r} has no implementation")
