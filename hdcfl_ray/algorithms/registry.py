"""Scenario `algorithm.name` -> algorithm object. Each method's parameters come
from its own section, `algorithm.<name>`."""

from __future__ import annotations

from hdcfl_ray.algorithms.base import Algorithm
from hdcfl_ray.config.schema import Scenario


def build_algorithm(scenario: Scenario) -> Algorithm:
    config = scenario.algorithm
    name = config.name
    if name == "fedavg_se":
        from hdcfl_ray.algorithms.fedavg_se import FedAvgSE

        return FedAvgSE()
    if name == "hdcfl":
        from hdcfl_ray.algorithms.hdcfl import HDCFL

        return HDCFL(config.hdcfl, rounds=scenario.protocol.rounds, seed=scenario.seed)
    if name == "fedavg":
        from hdcfl_ray.algorithms.fedavg import FedAvg

        return FedAvg()
    if name == "local":
        from hdcfl_ray.algorithms.local import LocalOnly

        return LocalOnly()
    if name == "fedbabu":
        from hdcfl_ray.algorithms.fedbabu import FedBABU

        return FedBABU(config.fedbabu, scenario)
    if name == "fedala":
        from hdcfl_ray.algorithms.fedala import FedALA

        return FedALA(config.fedala, scenario)
    if name == "fedce":
        from hdcfl_ray.algorithms.fedce import FedCE

        return FedCE(config.fedce, scenario)
    if name == "fedsoft":
        from hdcfl_ray.algorithms.fedsoft import FedSoft

        return FedSoft(config.fedsoft, scenario)
    if name == "ifca":
        from hdcfl_ray.algorithms.ifca import IFCA

        return IFCA(config.ifca, scenario)
    if name == "pacfl":
        from hdcfl_ray.algorithms.pacfl import PACFL

        return PACFL(config.pacfl, scenario)
    raise ValueError(f"algorithm.name: {name!r} has no implementation")
