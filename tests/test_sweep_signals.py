"""SIGTERM and SIGINT (once or twice, Ctrl-C's whole process group) stop `hdcfl-ray
sweep` resumably on both backends, as they stop `simulate` (tests/test_signals.py):
the run in flight marked `interrupted` (the index says `partial`), one line with the
command that continues the sweep (the same one), exit 130 / 143, no process of the
sweep's Ray instance alive 10 s later; and rerunning the command completes the sweep
to the same tables as an uninterrupted one. `calibrate` runs its runs through the
same code (cli._run_sweep_stoppably, sweep/runner.py)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from tests.conftest import tiny_scenario
from tests.test_signals import COMMAND, REPO, Run, _tree

SEEDS = "1,2"
KEYS = [("round", "ascending"), ("client_id", "ascending")]
METRICS = ("accuracy", "loss", "accuracy_global", "accuracy_local", "accuracy_personalized", "train_loss", "group")


class Sweep(Run):
    """`hdcfl-ray sweep` of one tiny scenario over two seeds, one run at a time, in a
    new session (its own process group)."""

    def __init__(self, tmp_path: Path, backend: str, rounds: int = 8) -> None:
        self.out = tmp_path / "sweep"
        self.scenario = tmp_path / "scenario.yaml"
        self.scenario.write_text(
            yaml.safe_dump(tiny_scenario(protocol={"rounds": rounds}, checkpoint={"every": 1}, runtime={"backend": backend}), sort_keys=False)
        )
        self.args = ["sweep", str(self.scenario), "--algorithms", "hdcfl", "--seeds", SEEDS, "--parallel", "1", "--out", str(self.out)]
        self.start(self.args)

    def wait_for_round(self, round_index: int, timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        while not _round_written(self.out, round_index):
            assert self.process.poll() is None, self.output()
            assert time.monotonic() < deadline, "the sweep did not reach its round in time"
            self.seen.update(_tree(self.process.pid))
            time.sleep(0.2)
        self.seen.update(_tree(self.process.pid))


def _round_written(out: Path, round_index: int) -> bool:
    """Whether some run under `out` has written round `round_index`'s rounds part.
    os.walk skips a folder that vanishes while it reads (a checkpoint's temporary
    folder renamed into place), where Path.glob raises."""
    part = f"part-{round_index:06d}.parquet"
    return any(Path(folder).name == "rounds.parquet" and part in files for folder, _, files in os.walk(out))


def _index(out: Path) -> dict[str, str]:
    return {entry["run_dir"]: entry["status"] for entry in json.loads((out / "index.json").read_text())["runs"]}


def _assert_stopped_resumably(sweep: Sweep, code: int, name: str, output: str) -> None:
    assert code == 128 + getattr(signal, name), output
    lines = [line for line in output.splitlines() if line.strip()]
    assert lines[-1] == (
        f"interrupted ({name}); finished runs are kept in {sweep.out}; continue with the same command: "
        f"{shlex.join(['hdcfl-ray', *sweep.args])}"
    ), output
    assert "Traceback" not in output and "*** SIG" not in output, output  # no Python or C++ stack
    statuses = _index(sweep.out)
    assert "running" not in statuses.values(), statuses
    interrupted = [run for run, status in statuses.items() if status == "partial"]
    assert interrupted, statuses  # the run in flight, resumable
    for run in interrupted:
        manifest = json.loads((sweep.out / run / "manifest.json").read_text())
        assert manifest["status"] == "interrupted" and manifest["interrupted_by"] == name, manifest


def _rerun_completes_to_the_uninterrupted_tables(sweep: Sweep, tmp_path: Path) -> None:
    from hdcfl_ray.runtime.driver import prepare_run, run_simulation
    from hdcfl_ray.sweeps.grid import SweepPlan, expand

    rerun = subprocess.run([*COMMAND, *sweep.args], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert set(_index(sweep.out).values()) == {"completed"}
    # the same runs, uninterrupted (on the local backend: both backends give the same bits)
    runs = expand(SweepPlan((sweep.scenario,), ("hdcfl",), (1, 2), ("runtime.backend=local",), tmp_path / "reference"))
    for run in runs:
        run_simulation(prepare_run(run.scenario), run.run_dir)
        resumed = sweep.out / run.run_dir.relative_to(tmp_path / "reference")
        for table in ("clients.parquet", "rounds.parquet"):
            assert pq.read_table(resumed / table).num_rows == pq.read_table(run.run_dir / table).num_rows, (run.key, table)
        ref = pq.read_table(run.run_dir / "clients.parquet").sort_by(KEYS)
        got = pq.read_table(resumed / "clients.parquet").sort_by(KEYS)
        for column in METRICS:
            assert got.column(column).to_pylist() == ref.column(column).to_pylist(), (run.key, column)


def _stop(tmp_path: Path, backend: str, name: str, twice: bool) -> None:
    sweep = Sweep(tmp_path, backend)
    try:
        sweep.wait_for_round(2)
        assert len(sweep.seen) > 3  # the sweep's Ray instance: the GCS, the raylet, its agents
        sweep.signal(getattr(signal, name), group=twice)
        if twice:
            time.sleep(0.3)
            if sweep.process.poll() is None:
                sweep.signal(getattr(signal, name), group=True)
        code = sweep.finish(timeout=90)
        _assert_stopped_resumably(sweep, code, name, sweep.output())
        assert sweep.processes_alive_after(10) == []
    finally:
        sweep.stop_leftovers()
    _rerun_completes_to_the_uninterrupted_tables(sweep, tmp_path)


@pytest.mark.slow  # a long end-to-end run: the slow tier (.ci/run runs it after the README's command)
def test_sigterm_stops_a_local_backend_sweep_resumably_and_its_rerun_completes_it(tmp_path):
    _stop(tmp_path, "local", "SIGTERM", twice=False)


@pytest.mark.slow
@pytest.mark.parametrize(
    "backend, name, twice",
    [("local", "SIGINT", True), ("ray", "SIGTERM", False), ("ray", "SIGINT", False), ("ray", "SIGINT", True)],
    ids=["local-double-ctrl-c", "ray-sigterm", "ray-ctrl-c", "ray-double-ctrl-c"],
)
def test_a_stop_signal_leaves_a_resumable_sweep_and_no_ray_process(tmp_path, backend, name, twice):
    _stop(tmp_path, backend, name, twice)


class Calibration(Sweep):
    """`hdcfl-ray calibrate` of HDC-FL's group count on the tiny scenario."""

    def __init__(self, tmp_path: Path, backend: str, rounds: int = 8) -> None:
        self.out = tmp_path / "calibration"
        self.scenario = tmp_path / "scenario.yaml"
        self.scenario.write_text(
            yaml.safe_dump(tiny_scenario(protocol={"rounds": rounds}, checkpoint={"every": 1}, runtime={"backend": backend}), sort_keys=False)
        )
        self.args = ["calibrate", str(self.scenario), "--key", "algorithm.hdcfl.groups", "--values", "2,3", "--parallel", "1", "--out", str(self.out)]
        self.start(self.args)


@pytest.mark.slow
def test_ctrl_c_stops_a_calibration_within_seconds_and_its_rerun_completes_it(tmp_path):
    calibration = Calibration(tmp_path, "ray")
    try:
        calibration.wait_for_round(2)
        started = time.monotonic()
        calibration.signal(signal.SIGINT, group=True)
        code = calibration.finish(timeout=60)
        assert time.monotonic() - started < 20
        _assert_stopped_resumably(calibration, code, "SIGINT", calibration.output())
        assert calibration.processes_alive_after(10) == []
    finally:
        calibration.stop_leftovers()
    rerun = subprocess.run([*COMMAND, *calibration.args], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert set(_index(calibration.out).values()) == {"completed"}
