"""Bad input stops before Ray starts, with exit code 2 and a message naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app
from hdcfl_ray.config import load_scenario
from hdcfl_ray.errors import ScenarioError
from tests.conftest import tiny_scenario

runner = CliRunner()


def run_validate(path: Path, *overrides: str):
    args = ["validate", str(path)]
    for override in overrides:
        args += ["--set", override]
    return runner.invoke(app, args)


@pytest.mark.parametrize(
    ("changes", "expected_fragments"),
    [
        ({"partition": {"kk": 3}}, ["partition.kk", "unknown key", "num_clients"]),
        ({"bogus_top": 1}, ["bogus_top", "unknown key at the top level"]),
        ({"protocol": {"rounds": "many"}}, ["protocol.rounds", "'many'"]),
        ({"partition": {"kind": "label_subset", "k": 12}}, ["partition.k", "12", "10 classes", "digits", "1..10"]),
        ({"protocol": {"participation": 1.5}}, ["protocol.participation", "1.5", "(0, 1]"]),
        ({"protocol": {"participation": 0}}, ["protocol.participation"]),
        ({"algorithm": {"name": "fedmagic"}}, ["algorithm.name", "fedmagic", "fedavg_se", "hdcfl"]),
        ({"algorithm": {"name": "hdcfl", "hdcfl": {"mix": 2.0}}}, ["algorithm.hdcfl.mix", "2.0"]),
        ({"algorithm": {"name": "hdcfl", "hdcfl": {"rnak": 8}}}, ["algorithm.hdcfl.rnak", "unknown key", "rank"]),
        ({"dataset": {"name": "parquet_images", "path": "/nonexistent/cifar"}}, ["dataset.path", "/nonexistent/cifar"]),
        ({"dataset": {"name": "cifar10", "path": "/nonexistent/c10"}}, ["/nonexistent/c10", "download"]),
        ({"partition": {"kind": "dirichlet"}}, ["partition.alpha"]),
        ({"partition": {"num_clients": 5000}}, ["partition.num_clients", "5000"]),
    ],
)
def test_bad_scenario_exits_2_naming_the_key(write_scenario, changes, expected_fragments):
    path = write_scenario(tiny_scenario(**changes))
    result = run_validate(path)
    assert result.exit_code == 2, result.output
    for fragment in expected_fragments:
        assert fragment in result.output, f"{fragment!r} not in:\n{result.output}"


def test_valid_scenario_validates(write_scenario):
    result = run_validate(write_scenario(tiny_scenario()))
    assert result.exit_code == 0, result.output
    assert "valid" in result.output


def test_override_changes_a_key(write_scenario):
    path = write_scenario(tiny_scenario())
    scenario = load_scenario(path, ["protocol.rounds=5", "dataset.test_fraction=0.3", "partition.angles=[0, 90]"])
    assert scenario.protocol.rounds == 5
    assert scenario.dataset.test_fraction == 0.3
    assert scenario.partition.angles == (0.0, 90.0)


def test_override_of_unknown_key_is_refused(write_scenario):
    result = run_validate(write_scenario(tiny_scenario()), "protocol.roundz=5")
    assert result.exit_code == 2
    assert "protocol.roundz" in result.output


def test_override_without_equals_is_refused(write_scenario):
    result = run_validate(write_scenario(tiny_scenario()), "protocol.rounds")
    assert result.exit_code == 2
    assert "KEY=VALUE" in result.output


def test_missing_scenario_file_exits_2(tmp_path):
    result = run_validate(tmp_path / "nope.yaml")
    assert result.exit_code == 2
    assert "nope.yaml" in result.output


def test_yaml_that_would_execute_is_refused(tmp_path):
    path = tmp_path / "evil.yaml"
    path.write_text("name: !!python/object/apply:os.system ['echo hacked']\n")
    with pytest.raises(ScenarioError, match="not valid YAML"):
        load_scenario(path)


def test_unset_environment_variable_names_the_key(write_scenario, monkeypatch):
    monkeypatch.delenv("HDCFL_TEST_UNSET", raising=False)
    path = write_scenario(tiny_scenario(dataset={"name": "parquet_images", "path": "${HDCFL_TEST_UNSET}/c10"}))
    with pytest.raises(ScenarioError, match=r"dataset\.path.*HDCFL_TEST_UNSET"):
        load_scenario(path)


def test_environment_variable_expands(write_scenario, monkeypatch, tmp_path):
    monkeypatch.setenv("HDCFL_TEST_DATA", str(tmp_path))
    path = write_scenario(tiny_scenario(dataset={"name": "parquet_images", "path": "${HDCFL_TEST_DATA}/c10"}))
    assert load_scenario(path).dataset.path == f"{tmp_path}/c10"


def test_simulate_with_bad_scenario_exits_2_before_ray(write_scenario):
    import ray

    path = write_scenario(tiny_scenario(protocol={"participation": 3.0}))
    was_running = ray.is_initialized()
    result = runner.invoke(app, ["simulate", str(path)])
    assert result.exit_code == 2
    assert ray.is_initialized() == was_running
