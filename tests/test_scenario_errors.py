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
        ({"algorithm": {"name": "hdcfl", "hdcfl": {"rnak": 8}}}, ["algorithm.hdcfl.rnak", "unknown key", "did you mean 'rank'?"]),
        ({"algorithm": {"name": "fedprx"}}, ["algorithm.name", "did you mean 'fedprox'?", "apfl", "pacfl"]),
        ({"protocol": {"mode": "asinc"}}, ["protocol.mode", "did you mean 'async'?"]),
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


# --- every check that can fail on the user's input runs in validate and before anything starts ---


def run_both(path: Path, out: Path, *overrides: str):
    """`validate` and `simulate --out OUT` on the same scenario."""
    flags = [part for override in overrides for part in ("--set", override)]
    return (
        runner.invoke(app, ["validate", str(path), *flags]),
        runner.invoke(app, ["simulate", str(path), *flags, "--out", str(out), "-q"]),
    )


def assert_refused_before_start(results, out: Path, *fragments: str) -> None:
    for result in results:
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output
        for fragment in fragments:
            assert fragment in result.output, f"{fragment!r} not in:\n{result.output}"
    assert not out.exists(), "a refused start left a run directory behind"


@pytest.fixture
def private_machine(monkeypatch):
    """Checks see a machine with 2 CPUs and no GPU, as a private Ray instance would."""
    from hdcfl_ray.runtime import machine_checks

    monkeypatch.setattr(machine_checks, "ray_placement", lambda runtime: "private")
    monkeypatch.setattr(
        machine_checks, "private_ray_capacity", lambda runtime: machine_checks.Capacity(2.0, 0.0, "the private Ray instance of this machine")
    )


@pytest.mark.parametrize("seed", [-1, 2**31, 2**63, 2**64 + 1])
def test_a_seed_outside_the_usable_range_exits_2(write_scenario, tmp_path, seed):
    path = write_scenario(tiny_scenario())
    assert_refused_before_start(run_both(path, tmp_path / "run", f"seed={seed}"), tmp_path / "run", "seed", str(seed), "0..2147483647")


@pytest.mark.parametrize("override", ["protocol.rounds=2147483648", "protocol.batch_size=99999999999999999999", "runtime.num_cpus=9223372036854775808"])
def test_an_integer_past_2_31_exits_2_naming_the_key(write_scenario, override):
    result = run_validate(write_scenario(tiny_scenario()), override)
    assert result.exit_code == 2, result.output
    assert override.split("=")[0] in result.output and "2^31" in result.output


@pytest.mark.parametrize("override", ["protocol.optimizer.lr=.inf", "protocol.system.speed.mean=.nan", "protocol.stragglers.deadline=.inf"])
def test_nan_and_infinity_are_refused_in_float_keys(write_scenario, override):
    result = run_validate(write_scenario(tiny_scenario()), override)
    assert result.exit_code == 2, result.output
    assert override.split("=")[0] in result.output and "finite" in result.output


@pytest.mark.parametrize("content", [bytes(range(256)), b"name: tiny\x00\n", b"\xff\xfe\x00n\x00a"])
def test_a_binary_scenario_file_exits_2_from_validate_simulate_and_sweep(tmp_path, content):
    path = tmp_path / "binary.yaml"
    path.write_bytes(content)
    results = [*run_both(path, tmp_path / "run"), runner.invoke(app, ["sweep", str(path), "--out", str(tmp_path / "sweep")])]
    assert_refused_before_start(results, tmp_path / "run", "binary.yaml", "not a text file")
    assert not (tmp_path / "sweep").exists()


@pytest.mark.parametrize(
    ("rows", "fragments"),
    [
        ("0,abc,1\n", ["line 2", "speed 'abc' is not a number"]),
        ("0,nan,1\n", ["line 2", "speed"]),
        ("0,inf,1\n", ["line 2", "speed", "finite"]),
        ("0,5,\n", ["line 2", "delay is empty"]),
        ("0,5,-1\n", ["line 2", "delay -1.0 must be >= 0"]),
        ("0,0,1\n", ["line 2", "speed 0.0 must be > 0"]),
        ("0,5,1\n0,6,1\n", ["line 3", "client_id 0 is listed again (first on line 2)"]),
        ("0,5,1\n,6,1\n", ["line 3", "client_id is empty"]),
        ("0,5,1\n1.5,6,1\n", ["line 3", "client_id is 1.5"]),
        ("0,5,1\n99,6,1\n", ["line 3", "client_id 99 is not in 0..7"]),
    ],
)
def test_a_trace_with_a_bad_value_exits_2_naming_the_file_and_line(write_scenario, tmp_path, rows, fragments):
    trace = tmp_path / "trace.csv"
    trace.write_text("client_id,speed,delay\n" + rows)
    path = write_scenario(tiny_scenario(protocol={"system": {"trace": str(trace)}}))
    assert_refused_before_start(run_both(path, tmp_path / "run"), tmp_path / "run", "protocol.system.trace", "trace.csv", *fragments)


def test_a_parquet_trace_with_nan_exits_2(write_scenario, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    trace = tmp_path / "trace.parquet"
    pq.write_table(pa.table({"client_id": [0, 1], "speed": [5.0, 6.0], "delay": [0.0, float("nan")]}), trace)
    path = write_scenario(tiny_scenario(protocol={"system": {"trace": str(trace)}}))
    assert_refused_before_start(run_both(path, tmp_path / "run"), tmp_path / "run", "trace.parquet row 2", "delay is nan")


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"client_id,speed,delay,availabe_from\n0,5,1,3\n", "unknown column(s) availabe_from"),
        (b"client_id,speed\n0,5\n", "lacks the column(s) delay"),
        (bytes(range(256)) * 4, "trace.csv"),
    ],
)
def test_a_trace_that_is_not_a_trace_exits_2(write_scenario, tmp_path, content, fragment):
    trace = tmp_path / "trace.csv"
    trace.write_bytes(content)
    path = write_scenario(tiny_scenario(protocol={"system": {"trace": str(trace)}}))
    assert_refused_before_start(run_both(path, tmp_path / "run"), tmp_path / "run", "protocol.system.trace", fragment)


def test_a_trace_that_leaves_out_clients_says_so(write_scenario, tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("client_id,speed,delay\n0,5,1\n3,2,0\n")
    result = run_validate(write_scenario(tiny_scenario(protocol={"system": {"trace": str(trace)}})))
    assert result.exit_code == 0, result.output
    assert "warning: protocol.system.trace" in result.output and "lists 2 of 8 clients" in result.output


def test_out_pointing_at_a_file_exits_2_without_advising_resume(write_scenario, tmp_path):
    target = tmp_path / "taken"
    target.write_text("not a run")
    result = runner.invoke(app, ["simulate", str(write_scenario(tiny_scenario())), "--out", str(target)])
    assert result.exit_code == 2, result.output
    assert "--out" in result.output and "is a file" in result.output and "--resume" not in result.output
    assert target.read_text() == "not a run"


def test_out_under_a_file_exits_2(write_scenario, tmp_path):
    (tmp_path / "taken").write_text("x")
    result = runner.invoke(app, ["simulate", str(write_scenario(tiny_scenario())), "--out", str(tmp_path / "taken" / "run")])
    assert result.exit_code == 2, result.output
    assert "is a file" in result.output


def _encoder_weights(path: Path, **model: object) -> Path:
    import torch

    from hdcfl_ray.config.schema import ModelConfig
    from hdcfl_ray.models.encoders import build_encoder

    torch.save(build_encoder(ModelConfig(**model), in_channels=1).state_dict(), path)
    return path


@pytest.mark.parametrize(
    ("make_file", "fragments"),
    [
        (lambda path: None, ["does not exist"]),
        (lambda path: path.write_bytes(bytes(range(256)) * 8), ["could not be read as a weights-only torch file"]),
        (lambda path: _encoder_weights(path, encoder="small_cnn", width=16, feature_dim=32), ["wrong shape"]),
        (lambda path: __import__("torch").save({"step": 3}, path), ["holds no tensors"]),
        (lambda path: __import__("torch").save({"features.0.weight": __import__("torch").full((8, 1, 3, 3), float("nan"))}, path), ["NaN or infinite"]),
    ],
)
def test_a_bad_pretrained_file_exits_2_before_a_run_directory_exists(write_scenario, tmp_path, make_file, fragments):
    weights = tmp_path / "weights.pt"
    make_file(weights)
    path = write_scenario(tiny_scenario(model={"encoder": "small_cnn", "width": 8, "feature_dim": 32, "pretrained": str(weights)}))
    assert_refused_before_start(run_both(path, tmp_path / "run"), tmp_path / "run", "model.pretrained", "weights.pt", *fragments)


def test_a_matching_pretrained_file_validates(write_scenario, tmp_path):
    weights = _encoder_weights(tmp_path / "weights.pt", encoder="small_cnn", width=8, feature_dim=32)
    path = write_scenario(tiny_scenario(model={"encoder": "small_cnn", "width": 8, "feature_dim": 32, "pretrained": str(weights)}))
    assert run_validate(path).exit_code == 0


def test_a_gpu_share_on_a_machine_without_gpus_exits_2(write_scenario, tmp_path, private_machine):
    path = write_scenario(tiny_scenario(runtime={"backend": "ray", "num_gpus_per_actor": 0.5}))
    assert_refused_before_start(run_both(path, tmp_path / "run"), tmp_path / "run", "runtime.num_gpus_per_actor", "has 0", "num_gpus_per_actor: 0")


def test_more_host_actors_than_cpus_exits_2(write_scenario, tmp_path, private_machine):
    path = write_scenario(tiny_scenario(runtime={"clients_per_actor": 1, "num_cpus_per_actor": 1}))
    assert_refused_before_start(
        run_both(path, tmp_path / "run"), tmp_path / "run", "8 client host actors", "need 8 CPUs", "has 2", "runtime.clients_per_actor"
    )


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("runtime.num_gpus_per_actor=1.5", "whole number"),
        ("runtime.num_cpus_per_actor=0.00001", "smallest share"),
        ("runtime.num_gpus_per_actor=0.00001", "smallest share"),
    ],
)
def test_a_share_ray_cannot_place_exits_2(write_scenario, override, fragment, private_machine):
    result = run_validate(write_scenario(tiny_scenario(runtime={"backend": "ray"})), override)
    assert result.exit_code == 2, result.output
    assert override.split("=")[0] in result.output and fragment in result.output


def test_the_local_backend_refuses_more_threads_than_cpus(write_scenario):
    import os

    result = run_validate(write_scenario(tiny_scenario(runtime={"backend": "local", "num_cpus": (os.cpu_count() or 1) + 1})))
    assert result.exit_code == 2, result.output
    assert "runtime.num_cpus" in result.output


def test_a_dashboard_host_beyond_loopback_is_refused(write_scenario, private_machine):
    result = run_validate(write_scenario(tiny_scenario(runtime={"backend": "ray", "include_dashboard": True, "dashboard_host": "0.0.0.0"})))
    assert result.exit_code == 2, result.output
    assert "runtime.dashboard_host" in result.output and "runtime.address" in result.output


@pytest.mark.parametrize(
    ("changes", "fragments"),
    [
        ({"model": {"width": 100000}}, ["model.width", "GiB"]),
        ({"model": {"feature_dim": 2**31 - 1, "width": 2**31 - 1}}, ["model.width", "more than torch can hold"]),
        ({"algorithm": {"name": "fedce", "fedce": {"clusters": 2**31 - 1}}}, ["algorithm.fedce.clusters"]),
        ({"dataset": {"name": "synthetic", "image_size": 2**20, "train_samples": 10}}, ["dataset.train_samples", "image_size", "GiB"]),
    ],
)
def test_sizes_this_machine_cannot_hold_exit_2(write_scenario, tmp_path, changes, fragments):
    path = write_scenario(tiny_scenario(**changes))
    assert_refused_before_start(run_both(path, tmp_path / "run"), tmp_path / "run", *fragments)


def test_a_capped_test_per_client_says_so(write_scenario):
    result = run_validate(write_scenario(tiny_scenario(partition={"test_per_client": 10000})))
    assert result.exit_code == 0, result.output
    assert "warning: partition.test_per_client: 10000" in result.output and "(capped)" in result.output


def test_test_sets_that_cannot_keep_their_class_proportions_say_so(write_scenario):
    # digits' test split holds 36 images of each class: a client mostly of one class runs out of it
    partition = {"kind": "dirichlet", "alpha": 0.1, "min_samples": 5, "test_per_client": 90}
    result = run_validate(write_scenario(tiny_scenario(partition=partition)))
    assert result.exit_code == 0, result.output
    assert "warning: partition: the test split holds too few images of some classes" in result.output
    assert "or less keeps every client's proportions" in result.output


def test_a_failed_start_leaves_nothing_behind_and_the_rerun_uses_the_same_out(write_scenario, tmp_path, monkeypatch):
    from hdcfl_ray.runtime import driver

    def refuse(prepared):
        raise ScenarioError("model.pretrained: refused while the run started")

    path = write_scenario(
        tiny_scenario(
            algorithm={"name": "fedavg_se"}, partition={"num_clients": 4}, protocol={"rounds": 1},
            runtime={"backend": "local"}, checkpoint={"every": None},
        )
    )
    out = tmp_path / "run"
    with monkeypatch.context() as patch:
        patch.setattr(driver, "LocalBackend", refuse)
        result = runner.invoke(app, ["simulate", str(path), "--out", str(out), "-q"])
    assert result.exit_code == 2 and "refused while the run started" in result.output
    assert not out.exists()
    result = runner.invoke(app, ["simulate", str(path), "--out", str(out), "-q"])
    assert result.exit_code == 0, result.output
    assert (out / "manifest.json").is_file()


@pytest.mark.ray
def test_a_joined_clusters_capacity_is_checked_before_the_run_directory(ray_session, write_scenario, tmp_path):
    import dataclasses

    from hdcfl_ray.runtime.driver import prepare_run, run_simulation

    prepared = prepare_run(load_scenario(write_scenario(tiny_scenario(runtime={"backend": "ray"}))))
    # what the cluster turns out to hold is known only once joined: ask it for more than it has
    too_big = prepared.scenario.model_copy(
        update={"runtime": prepared.scenario.runtime.model_copy(update={"clients_per_actor": 1, "num_cpus_per_actor": 1.0})}
    )
    with pytest.raises(ScenarioError, match="need 8 CPUs"):
        run_simulation(dataclasses.replace(prepared, scenario=too_big), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_cluster_address_where_nothing_listens_exits_2(write_scenario, monkeypatch):
    import socket

    from hdcfl_ray.runtime import machine_checks

    monkeypatch.setattr(machine_checks, "ray_placement", lambda runtime: "cluster")
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = run_validate(write_scenario(tiny_scenario(runtime={"address": f"127.0.0.1:{port}"})))
    assert result.exit_code == 2, result.output
    assert "runtime.address" in result.output and "nothing answers" in result.output


def test_sweep_algorithm_typo_names_the_near_miss():
    from hdcfl_ray.sweeps.grid import resolve_algorithms

    with pytest.raises(ScenarioError) as raised:
        resolve_algorithms(("hdcfl", "fedavg_es"))
    message = str(raised.value)
    assert "fedavg_es (did you mean 'fedavg_se'?) unknown" in message and "fedprox" in message
