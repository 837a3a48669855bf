"""Shared fixtures: one Ray instance per test session, sized for 2 CPUs."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

os.environ.setdefault("RAY_DEDUP_LOGS", "1")

# A wall-clock deadline (seconds since the epoch) after which no further test starts: the
# GPU check gives the cuda suite a fixed budget, and a test cut off by the step's SIGTERM
# would read as a failure (a run stops on SIGTERM), while one skipped here reads as not run.
DEADLINE_ENV = "HDCFL_TEST_DEADLINE"


def pytest_runtest_setup(item: pytest.Item) -> None:
    deadline = os.environ.get(DEADLINE_ENV)
    if deadline and time.time() > float(deadline):
        pytest.skip(f"not started: past {DEADLINE_ENV} (the time budget of the run that set it)")


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    import ray

    from hdcfl_ray.runtime.backends.ray_session import start_private_ray

    start_private_ray(num_cpus=2)  # started as a run starts its own: loopback only
    try:
        yield
    finally:
        ray.shutdown()


# Every method's section for a small federation of two planted groups (a few clients
# per group, a round or two): the counts and thresholds that let each one form groups.
SMALL_FEDERATION_METHODS: dict[str, Any] = {
    "hdcfl": {"groups": 2, "activation_round": 1, "refresh_every": 1},
    "fedce": {"clusters": 2},
    "fedsoft": {"centers": 2, "selection": 3},
    "ifca": {"clusters": 2},
    "pacfl": {"proximity": "elementwise", "threshold": 8.5, "threshold_unit": "degrees"},
}


def tiny_scenario(**sections: Any) -> dict[str, Any]:
    """A digits scenario small enough for a unit-test run (seconds, not minutes)."""
    scenario: dict[str, Any] = {
        "name": "tiny",
        "seed": 7,
        "dataset": {"name": "digits"},
        "partition": {"kind": "rotation", "num_clients": 8, "angles": [0, 180], "test_per_client": 30},
        "model": {"encoder": "small_cnn", "width": 8, "feature_dim": 32},
        "algorithm": {"name": "hdcfl", "hdcfl": {"groups": 2, "activation_round": 2, "refresh_every": 1}},
        "protocol": {"rounds": 3, "participation": 1.0, "local_epochs": 1, "batch_size": 32},
        "runtime": {"clients_per_actor": "auto", "num_cpus_per_actor": 1},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(scenario.get(key), dict):
            scenario[key] = {**scenario[key], **value}
        else:
            scenario[key] = value
    return scenario


@pytest.fixture
def write_scenario(tmp_path: Path):
    def write(data: dict[str, Any], name: str = "scenario.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return write
