"""Scenario schema and loading."""

from hdcfl_ray.config.loading import load_scenario, scenario_to_yaml
from hdcfl_ray.config.schema import Scenario

__all__ = ["Scenario", "load_scenario", "scenario_to_yaml"]
