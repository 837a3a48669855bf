"""Shared fixtures: one Ray instance per test session, sized for 2 CPUs."""

from __future__ import annotations

import importlib.util
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

# Tests whose run computes an epsilon need Opacus's accountant (the dp extra); the README's test
# command installs only the test extra, so they skip there with the command that adds it.
ACCOUNTANT_MISSING = "the accountant needs Opacus: pip install 'hdcfl-ray[dp]'"
needs_accountant = pytest.mark.skipif(importlib.util.find_spec("opacus") is None, reason=ACCOUNTANT_MISSING)


def pytest_runtest_setup(item: pytest.Item) -> None:
    deadline = os.environ.get(DEADLINE_ENV)
    if deadline and time.time() > float(deadline):
        pytest.skip(f"not started: past {DEADLINE_ENV} (the time budget of the run that set it)")


@pytest.fixture(scope="session", autouse=True)
def _auto_knobs_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Choices of auto knobs go to a folder of this test session, never the user's cache
    (HDCFL_RAY_CACHE, which the commands the tests start inherit)."""
    from hdcfl_ray.auto_knobs.cache import CACHE_VARIABLE

    previous = os.environ.get(CACHE_VARIABLE)
    os.environ[CACHE_VARIABLE] = str(tmp_path_factory.mktemp("hdcfl-ray-cache"))
    yield
    if previous is None:
        os.environ.pop(CACHE_VARIABLE, None)
    else:
        os.environ[CACHE_VARIABLE] = previous


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    import ray

    from hdcfl_ray.runtime.backends.ray_session import start_private_ray

    start_private_ray(num_cpus=2)  # started as a run starts its own: loopback only
    try:
        yield
    finally:
        ray.shutdown()


# The knobs a run would otherwise choose for itself (`auto`, the schema's default: a grid
# of candidate runs before each run), pinned at the values they had before `auto` existed,
# so the suite's runs keep their bits and their time. A test of `auto` sets it explicitly
# and is marked `auto_knobs` (the fixture below refuses to choose knobs in any other test).
PINNED_AUTO_KNOBS: dict[str, dict[str, Any]] = {
    "hdcfl": {"groups": 4},
    "fedce": {"clusters": 4, "temperature": 4.0},
    "fedprox": {"mu": 0.01},
    "fedsoft": {"centers": 3, "proximal": 0.01},
    "ifca": {"clusters": 4},
    "pacfl": {"threshold": 1.5},
}

# Every method's section for a small federation of two planted groups (a few clients
# per group, a round or two): the counts and thresholds that let each one form groups.
SMALL_FEDERATION_METHODS: dict[str, Any] = {
    "hdcfl": {"groups": 2, "activation_round": 1, "refresh_every": 1},
    "fedce": {**PINNED_AUTO_KNOBS["fedce"], "clusters": 2},
    "fedprox": PINNED_AUTO_KNOBS["fedprox"],
    "fedsoft": {**PINNED_AUTO_KNOBS["fedsoft"], "centers": 2, "selection": 3},
    "ifca": {"clusters": 2},
    "pacfl": {"proximity": "elementwise", "threshold": 8.5, "threshold_unit": "degrees"},
}


@pytest.fixture(autouse=True)
def _no_unasked_auto_knobs(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that would choose `auto` knobs (candidate runs, minutes) fails at once unless the
    test is marked `auto_knobs`: every other test pins them (PINNED_AUTO_KNOBS)."""
    import hdcfl_ray.auto_knobs.choose as choose

    if request.node.get_closest_marker("auto_knobs") is not None:
        _every_kept_choice_passes_its_own_checks(choose, monkeypatch)
        return

    def refuse(scenario: Any, plan: Any, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError(
            f"this test's run would choose its auto knobs ({', '.join(knob.key for knob in plan.knobs)}): "
            "pin them (tests/conftest.py PINNED_AUTO_KNOBS) or mark the test auto_knobs"
        )

    monkeypatch.setattr(choose, "choose_auto_knobs", refuse)


def _every_kept_choice_passes_its_own_checks(choose: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every choice a test makes for real is checked, as it is kept, by the checks a later
    run applies before using it (auto_knobs/evidence.py): a genuine choice (twins, replays,
    values beyond the grid, finalists) must never be turned down as forged."""
    from hdcfl_ray.auto_knobs.evidence import record_problems, scored_folder

    write = choose.write_choice

    def checked_write(entry: Any, key: Any, record: Any) -> None:
        if choose._scored is scored_folder:  # not when a test gives the candidates made-up scores
            assert record_problems(record, entry) == [], f"a genuine choice fails its own checks: {record_problems(record, entry)}"
        write(entry, key, record)

    monkeypatch.setattr(choose, "write_choice", checked_write)


def slow_beyond(values: Any, fast: Any) -> list[Any]:
    """The cases of a parametrized test whose every case is a long end-to-end run: those in
    `fast` run in the README's test command, the others are marked slow, for the slow tier
    that `.ci/run` runs after it (so every case still runs in CI)."""
    def slow(value: Any) -> Any:  # a tuple is the values of several parameters
        return pytest.param(*(value if isinstance(value, tuple) else (value,)), marks=pytest.mark.slow)

    return [value if value in fast else slow(value) for value in values]


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
    algorithm = scenario.get("algorithm")
    if isinstance(algorithm, dict):  # keys a test leaves out keep their pinned value, never `auto`
        for method, pinned in PINNED_AUTO_KNOBS.items():
            algorithm[method] = {**pinned, **(algorithm.get(method) or {})}
    return scenario


@pytest.fixture
def write_scenario(tmp_path: Path):
    def write(data: dict[str, Any], name: str = "scenario.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return write
