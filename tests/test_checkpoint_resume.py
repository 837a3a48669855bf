"""Checkpoints: a safe codec; a run stopped after round k resumes to the same
final metrics with no duplicate log rows; a crash while writing, or a damaged
checkpoint or manifest, never costs more than the rounds since the previous one."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow.parquet as pq
import pytest

from hdcfl_ray.contract import ModelParams
from hdcfl_ray.checkpoint.codec import CheckpointFormatError, Decoder, Encoder
from hdcfl_ray.checkpoint.store import read_checkpoint, write_checkpoint
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.terminal.live_view import QuietObserver
from tests.conftest import ACCOUNTANT_MISSING, slow_beyond, tiny_scenario
from tests.stop_observer import StopAfterRound


def test_codec_round_trips_package_dataclasses_arrays_and_special_floats(tmp_path):
    value = {
        3: ModelParams(np.arange(4, dtype=np.float32), None),
        "tuple": (1, 2.5, float("nan"), float("inf")),
        "nested": [{"x": np.ones((2, 2))}],
    }
    write_checkpoint(tmp_path, value)
    restored = read_checkpoint(tmp_path)
    assert np.array_equal(restored[3].encoder, value[3].encoder) and restored[3].head is None
    assert restored["tuple"][0:2] == (1, 2.5) and np.isnan(restored["tuple"][2]) and restored["tuple"][3] == float("inf")
    assert np.array_equal(restored["nested"][0]["x"], np.ones((2, 2)))


def test_writable_copies_read_only_arrays_and_keeps_the_structure():
    from hdcfl_ray.checkpoint.codec import writable

    frozen = np.arange(4.0)
    frozen.setflags(write=False)
    kept = np.zeros(2)
    state = {"params": ModelParams(encoder=frozen, head=None), "rows": [frozen, (frozen, 3)], "kept": kept, "n": 2}
    thawed = writable(state)
    assert thawed["params"].encoder.flags.writeable and np.array_equal(thawed["params"].encoder, frozen)
    assert thawed["rows"][0].flags.writeable and thawed["rows"][1][0].flags.writeable and thawed["rows"][1][1] == 3
    assert thawed["kept"] is kept and thawed["n"] == 2


def test_codec_refuses_classes_outside_the_package():
    @dataclasses.dataclass
    class Foreign:
        x: int

    with pytest.raises(CheckpointFormatError):
        Encoder().encode(Foreign(1))
    with pytest.raises(CheckpointFormatError):
        Decoder({}).decode({"__dataclass__": "os:system", "fields": {}})
    with pytest.raises(CheckpointFormatError):
        Encoder().encode(object())


def test_a_checkpoint_naming_the_runtime_modules_before_their_move_still_decodes():
    from hdcfl_ray.runtime.server.messages import UploadMeta

    # as an asynchronous run's checkpoint wrote an update before runtime/ was laid out by concept
    encoded = Encoder().encode(UploadMeta(3, 10, 0.5, 2, {}, True))
    encoded["__dataclass__"] = "hdcfl_ray.runtime.messages:UploadMeta"
    assert Decoder({}).decode(encoded) == UploadMeta(3, 10, 0.5, 2, {}, True)


def test_a_checkpoint_naming_the_contract_values_by_their_old_module_still_decodes():
    """Every server state holds ModelParams; before hdcfl_ray/contract they lived in algorithms/base.py."""
    from hdcfl_ray.contract import ModelParams

    params = ModelParams(np.arange(3, dtype=np.float32), np.ones(2, dtype=np.float32))
    encoder = Encoder()
    encoded = encoder.encode(params)
    encoded["__dataclass__"] = "hdcfl_ray.algorithms.base:ModelParams"
    decoded = Decoder(encoder.arrays).decode(encoded)
    assert isinstance(decoded, ModelParams) and np.array_equal(decoded.encoder, params.encoder)


METRICS = ("accuracy", "loss", "accuracy_global", "accuracy_local", "accuracy_personalized", "train_loss", "group")


@pytest.mark.usefixtures("ray_session")
# FedSoft updates its server state in place after the resume (importance rows at round 4):
# the restored state reaches the Ray server actor through the object store, read-only
@pytest.mark.parametrize("mode, method", slow_beyond([("sync", "hdcfl"), ("async", "hdcfl"), ("sync", "fedsoft")], fast={("sync", "hdcfl")}))
def test_resume_after_a_stop_gives_the_uninterrupted_metrics_without_duplicate_rows(tmp_path, mode, method):
    protocol = {"rounds": 5, "participation": 0.5}
    if mode == "async":
        protocol.update(mode="async", asynchronous={"concurrency": 3, "aggregation": "fedbuff", "buffer_size": 2}, system={"speed": {"kind": "lognormal", "mean": 4.0}})
    scenario = build_scenario(
        tiny_scenario(
            protocol=protocol,
            checkpoint={"every": 2},
            algorithm={
                "name": method,
                "hdcfl": {"groups": 2, "activation_round": 2, "refresh_every": 1},
                "fedsoft": {"centers": 2, "selection": 3, "importance_every": 2},
            },
            runtime={"backend": "ray"},
        )
    )
    reference = tmp_path / "reference"
    run_simulation(prepare_run(scenario), reference, QuietObserver())

    stopped = tmp_path / "stopped"
    with pytest.raises(KeyboardInterrupt):
        run_simulation(prepare_run(scenario), stopped, StopAfterRound(3))  # checkpoint at 2, round 3 logged
    assert pq.read_table(stopped / "rounds.parquet").num_rows == 3
    run_simulation(prepare_run(scenario), stopped, QuietObserver(), resume=True)

    for table in ("clients", "rounds", "refresh", "updates") if method == "hdcfl" else ("clients", "rounds", "updates"):
        ref = pq.read_table(reference / f"{table}.parquet")
        got = pq.read_table(stopped / f"{table}.parquet")
        assert got.num_rows == ref.num_rows, table
    keys = [("round", "ascending"), ("client_id", "ascending")]
    ref = pq.read_table(reference / "clients.parquet").sort_by(keys)
    got = pq.read_table(stopped / "clients.parquet").sort_by(keys)
    pairs = list(zip(got.column("round").to_pylist(), got.column("client_id").to_pylist()))
    assert len(pairs) == len(set(pairs))
    for column in METRICS:
        assert got.column(column).to_pylist() == ref.column(column).to_pylist(), column


# a run under client-level DP: its noise streams, its accountant's releases and its clip are
# part of what must come back after a kill
PRIVATE = {"noise_multiplier": 1.0, "clip": 0.5, "noise_cohort_size": 500}


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("privacy", [None, PRIVATE], ids=["plain", "private"])
def test_killing_the_simulate_process_and_resuming_matches_the_uninterrupted_run(tmp_path, write_scenario, privacy):
    """A real SIGKILL of `hdcfl-ray simulate` (it joins this session's Ray cluster,
    so its actors die with it), then `--resume`; under DP the epsilons too."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import ray
    from typer.testing import CliRunner

    from cli import app

    if privacy is not None:
        pytest.importorskip("opacus", reason=ACCOUNTANT_MISSING)
    data = tiny_scenario(protocol={"rounds": 6}, checkpoint={"every": 2}, algorithm={"name": "hdcfl", "hdcfl": {"groups": 2, "activation_round": 2, "refresh_every": 2}})
    if privacy is not None:
        data["privacy"] = dict(privacy)
    path = write_scenario(data)
    reference = tmp_path / "reference"
    assert CliRunner().invoke(app, ["simulate", str(path), "--out", str(reference), "--quiet"]).exit_code == 0

    killed = tmp_path / "killed"
    address = ray.get_runtime_context().gcs_address
    repo = Path(__file__).resolve().parent.parent
    process = subprocess.Popen(
        [sys.executable, "-c", "from cli import app; app()", "simulate", str(path), "--out", str(killed), "--quiet", "--set", f"runtime.address={address}"],
        cwd=repo,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 240
    while not (killed / "rounds.parquet" / "part-000003.parquet").exists():
        assert process.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline, "round 3 never finished"
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()

    result = CliRunner().invoke(app, ["simulate", "--resume", str(killed), "--quiet"])
    assert result.exit_code == 0, result.output
    keys = [("round", "ascending"), ("client_id", "ascending")]
    ref = pq.read_table(reference / "clients.parquet").sort_by(keys)
    got = pq.read_table(killed / "clients.parquet").sort_by(keys)
    assert got.num_rows == ref.num_rows == 6 * 8
    for column in METRICS:
        assert got.column(column).to_pylist() == ref.column(column).to_pylist(), column
    rounds = pq.read_table(killed / "rounds.parquet").sort_by("round")
    assert rounds.column("round").to_pylist() == [1, 2, 3, 4, 5, 6]
    if privacy is not None:
        epsilons = rounds.column("epsilon").to_pylist()
        assert all(value is not None and value > 0 for value in epsilons)
        assert epsilons == pq.read_table(reference / "rounds.parquet").sort_by("round").column("epsilon").to_pylist()


# --- checkpoints that can be trusted after a crash ---------------------------------


def _truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _two_checkpoints(run_dir):
    run_dir.mkdir(exist_ok=True)
    for round_index in (1, 2):
        write_checkpoint(run_dir, {"round": round_index, "weights": np.full(64, float(round_index))})


def test_writing_a_checkpoint_keeps_the_one_before_it(tmp_path):
    _two_checkpoints(tmp_path)
    assert read_checkpoint(tmp_path)["round"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "checkpoint.prev"]  # no staging left over
    write_checkpoint(tmp_path, {"round": 3})
    assert read_checkpoint(tmp_path)["round"] == 3
    assert (tmp_path / "checkpoint.prev" / "state.json").read_text().count('"round": 2') == 1


@pytest.mark.parametrize("damaged_file", ["arrays.npz", "state.json"])
def test_a_truncated_newest_checkpoint_is_named_and_the_previous_one_is_used(tmp_path, damaged_file):
    from hdcfl_ray.checkpoint.store import find_checkpoint

    _two_checkpoints(tmp_path)
    _truncate(tmp_path / "checkpoint" / damaged_file)
    search = find_checkpoint(tmp_path)
    assert search.found is not None and search.found.directory == tmp_path / "checkpoint.prev"
    assert search.found.payload()["round"] == 1
    (damaged,) = search.damaged
    assert damaged.file == tmp_path / "checkpoint" / damaged_file
    assert "truncated" in damaged.describe()


def test_an_altered_array_file_is_caught_by_its_digest(tmp_path):
    from hdcfl_ray.checkpoint.store import find_checkpoint

    _two_checkpoints(tmp_path)
    arrays = tmp_path / "checkpoint" / "arrays.npz"
    data = bytearray(arrays.read_bytes())
    data[len(data) // 2] ^= 0xFF
    arrays.write_bytes(bytes(data))
    search = find_checkpoint(tmp_path)
    assert search.found.payload()["round"] == 1 and "SHA-256" in search.damaged[0].reason


def test_when_every_checkpoint_is_damaged_the_error_names_each_file_and_the_fix(tmp_path):
    from hdcfl_ray.checkpoint.store import CheckpointDamagedError

    _two_checkpoints(tmp_path)
    _truncate(tmp_path / "checkpoint" / "arrays.npz")
    (tmp_path / "checkpoint.prev" / "state.json").write_text("")
    with pytest.raises(CheckpointDamagedError) as caught:
        read_checkpoint(tmp_path)
    message = str(caught.value)
    assert str(tmp_path / "checkpoint" / "arrays.npz") in message
    assert str(tmp_path / "checkpoint.prev" / "state.json") in message
    assert "delete" in message and "--resume" in message


def test_a_crash_while_writing_a_checkpoint_leaves_the_last_complete_one(tmp_path, monkeypatch):
    import hdcfl_ray.checkpoint.store as store

    _two_checkpoints(tmp_path)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed while writing")

    monkeypatch.setattr(store, "_rotate_in", killed)  # staging written, never rotated in
    with pytest.raises(KeyboardInterrupt):
        write_checkpoint(tmp_path, {"round": 3})
    assert read_checkpoint(tmp_path)["round"] == 2


def test_a_crash_between_the_two_renames_resumes_from_the_previous_checkpoint(tmp_path):
    import os

    _two_checkpoints(tmp_path)
    os.replace(tmp_path / "checkpoint.prev", tmp_path / ".checkpoint.discard")
    os.replace(tmp_path / "checkpoint", tmp_path / "checkpoint.prev")  # the newest moved, the staging not yet in
    assert read_checkpoint(tmp_path)["round"] == 2
    write_checkpoint(tmp_path, {"round": 3})  # the next write tidies up
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "checkpoint.prev"]


def test_the_manifest_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    import json
    import os

    from hdcfl_ray.logs.manifest import update_manifest

    (tmp_path / "manifest.json").write_text(json.dumps({"status": "running"}))

    def power_cut(descriptor):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "fsync", power_cut)
    with pytest.raises(OSError):
        update_manifest(tmp_path, status="completed")
    assert json.loads((tmp_path / "manifest.json").read_text()) == {"status": "running"}


LOCAL_RUN = tiny_scenario(protocol={"rounds": 4}, checkpoint={"every": 1}, runtime={"backend": "local"})


@pytest.fixture(scope="module")
def local_reference(tmp_path_factory):
    """The uninterrupted local-backend run that the resumed runs below must equal."""
    reference = tmp_path_factory.mktemp("local") / "reference"
    run_simulation(prepare_run(build_scenario(LOCAL_RUN)), reference, QuietObserver())
    return reference


def _stopped_local_run(tmp_path, stop_after=3):
    """LOCAL_RUN with a checkpoint every round, stopped after `stop_after` rounds."""
    stopped = tmp_path / "stopped"
    with pytest.raises(KeyboardInterrupt):
        run_simulation(prepare_run(build_scenario(LOCAL_RUN)), stopped, StopAfterRound(stop_after))
    return stopped


def _assert_same_client_metrics(reference, got_dir):
    keys = [("round", "ascending"), ("client_id", "ascending")]
    ref = pq.read_table(reference / "clients.parquet").sort_by(keys)
    got = pq.read_table(got_dir / "clients.parquet").sort_by(keys)
    assert got.num_rows == ref.num_rows
    for column in METRICS:
        assert got.column(column).to_pylist() == ref.column(column).to_pylist(), column
    for table in ("rounds", "refresh", "updates"):
        assert pq.read_table(got_dir / f"{table}.parquet").num_rows == pq.read_table(reference / f"{table}.parquet").num_rows, table


@pytest.mark.slow
def test_resume_with_a_truncated_checkpoint_names_it_and_continues_from_the_previous_one(tmp_path, local_reference):
    import json

    from typer.testing import CliRunner

    from cli import app

    stopped = _stopped_local_run(tmp_path)  # checkpoints of rounds 2 and 3 on disk
    _truncate(stopped / "checkpoint" / "arrays.npz")
    result = CliRunner().invoke(app, ["simulate", "--resume", str(stopped), "--quiet"])
    assert result.exit_code == 0, result.output
    assert str(stopped / "checkpoint" / "arrays.npz") in result.output and "previous checkpoint" in result.output
    manifest = json.loads((stopped / "manifest.json").read_text())
    assert manifest["status"] == "completed" and manifest["resumed_from_round"] == 2
    assert manifest["damaged_checkpoints"] and "arrays.npz" in manifest["damaged_checkpoints"][0]
    _assert_same_client_metrics(local_reference, stopped)  # round 3 was redone once, not logged twice


def test_an_empty_manifest_stops_resume_with_exit_2_naming_the_file(tmp_path):
    from typer.testing import CliRunner

    from cli import app

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "scenario.yaml").write_text(__import__("yaml").safe_dump(tiny_scenario()))
    (run_dir / "manifest.json").write_text("")
    result = CliRunner().invoke(app, ["simulate", "--resume", str(run_dir), "--quiet"])
    assert result.exit_code == 2, result.output
    assert "manifest.json" in result.output and "empty" in result.output and "delete it" in result.output
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_a_deleted_manifest_is_written_anew_by_resume(tmp_path, local_reference):
    import json

    from typer.testing import CliRunner

    from cli import app

    stopped = _stopped_local_run(tmp_path, stop_after=2)
    (stopped / "manifest.json").unlink()
    result = CliRunner().invoke(app, ["simulate", "--resume", str(stopped), "--quiet"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((stopped / "manifest.json").read_text())
    assert manifest["status"] == "completed" and "manifest_rewritten_at_resume" in manifest and manifest["packages"]
    _assert_same_client_metrics(local_reference, stopped)


@pytest.mark.parametrize(
    "override, said",
    [("protocol.optimizer.lr=0.01", "only runtime.* keys"), ("runtime.precision=bf16", "except runtime.precision")],
)
def test_resume_refuses_a_setting_that_would_change_the_results(tmp_path, override, said):
    from typer.testing import CliRunner

    from cli import app

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "scenario.yaml").write_text(__import__("yaml").safe_dump(tiny_scenario()))
    result = CliRunner().invoke(app, ["simulate", "--resume", str(run_dir), "--set", override])
    assert result.exit_code == 2, result.output
    assert said in result.output


def test_a_run_killed_while_writing_its_scenario_does_not_block_the_same_out_again(tmp_path):
    from hdcfl_ray.runtime.driver import claim_run_dir

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / ".scenario.yaml.tmp").write_text("name: tin")  # killed before the rename
    claim_run_dir(run_dir)  # no error: nothing of a run is there yet
