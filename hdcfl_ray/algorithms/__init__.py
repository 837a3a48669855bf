"""Federated algorithms, one module each, behind the interface in `base`."""

from __future__ import annotations

from hdcfl_ray.algorithms.base import Algorithm
from hdcfl_ray.algorithms.fedavg_se import FedAvgSE
from hdcfl_ray.algorithms.hdcfl import HDCFL
from hdcfl_ray.config.schema import HDCFLAlgorithm, Scenario


def build_algorithm(scenario: Scenario) -> Algorithm:
    config = scenario.algorithm
    if isinstance(config, HDCFLAlgorithm):
        return HDCFL(config, rounds=scenario.protocol.rounds, seed=scenario.seed)
    return FedAvgSE()


__all__ = ["Algorithm", "FedAvgSE", "HDCFL", "build_algorithm"]
