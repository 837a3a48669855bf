"""Checkpoints: a safe codec, and a run stopped after round k resumes to the same
final metrics with no duplicate log rows."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow.parquet as pq
import pytest

from hdcfl_ray.algorithms.base import ModelParams
from hdcfl_ray.checkpoint.codec import CheckpointFormatError, Decoder, Encoder
from hdcfl_ray.checkpoint.store import read_checkpoint, write_checkpoint
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.runtime.simulation import prepare_run, run_simulation
from hdcfl_ray.terminal.live_view import QuietObserver
from tests.conftest import tiny_scenario


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


class StopAfterRound(QuietObserver):
    def __init__(self, round_index: int) -> None:
        self.round_index = round_index

    def on_round(self, round_row, refresh_row, events):
        if round_row["round"] == self.round_index:
            raise KeyboardInterrupt("stopped by the test")


METRICS = ("accuracy", "loss", "accuracy_global", "accuracy_local", "accuracy_personalized", "train_loss", "group")


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_resume_after_a_stop_gives_the_uninterrupted_metrics_without_duplicate_rows(tmp_path, mode):
    protocol = {"rounds": 5, "participation": 0.5}
    if mode == "async":
        protocol.update(mode="async", asynchronous={"concurrency": 3, "aggregation": "fedbuff", "buffer_size": 2}, system={"speed": {"kind": "lognormal", "mean": 4.0}})
    scenario = build_scenario(
        tiny_scenario(
            protocol=protocol,
            checkpoint={"every": 2},
            algorithm={"name": "hdcfl", "hdcfl": {"groups": 2, "activation_round": 2, "refresh_every": 1}},
        )
    )
    reference = tmp_path / "reference"
    run_simulation(prepare_run(scenario), reference, QuietObserver())

    stopped = tmp_path / "stopped"
    with pytest.raises(KeyboardInterrupt):
        run_simulation(prepare_run(scenario), stopped, StopAfterRound(3))  # checkpoint at 2, round 3 logged
    assert pq.read_table(stopped / "rounds.parquet").num_rows == 3
    run_simulation(prepare_run(scenario), stopped, QuietObserver(), resume=True)

    for table in ("clients", "rounds", "refresh", "updates"):
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


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_killing_the_simulate_process_and_resuming_matches_the_uninterrupted_run(tmp_path, write_scenario):
    """A real SIGKILL of `hdcfl-ray simulate` (it joins this session's Ray cluster,
    so its actors die with it), then `--resume`."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import ray
    from typer.testing import CliRunner

    from cli import app

    data = tiny_scenario(protocol={"rounds": 6}, checkpoint={"every": 2}, algorithm={"name": "hdcfl", "hdcfl": {"groups": 2, "activation_round": 2, "refresh_every": 2}})
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
    assert pq.read_table(killed / "rounds.parquet").column("round").to_pylist() == [1, 2, 3, 4, 5, 6]
