"""A batched run's bits depend on which clients train together on a host, so a resume
that would put them on other hosts is refused, naming what moved them, unless the user
allows it; then the manifest records the change and the report marks the run. An
unbatched run trains every client alone: its layout may change, bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from cli import app
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.terminal.live_view import QuietObserver
from tests.conftest import tiny_scenario
from tests.stop_observer import StopAfterRound

runner = CliRunner()
METRICS = ("accuracy", "loss", "train_loss")


def _scenario(batched: bool) -> dict:
    return tiny_scenario(
        algorithm={"name": "fedavg_se"},
        protocol={"rounds": 4, "participation": 0.5},
        runtime={"backend": "local", "num_cpus": 2, "batched_training": batched},
        checkpoint={"every": 1},
    )


def _stopped_run(tmp_path: Path, batched: bool, name: str = "run") -> Path:
    run_dir = tmp_path / name
    with pytest.raises(KeyboardInterrupt):
        run_simulation(prepare_run(build_scenario(_scenario(batched))), run_dir, StopAfterRound(2))
    return run_dir


def _manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


def _client_rows(run_dir: Path) -> list[tuple]:
    table = pq.read_table(run_dir / "clients.parquet").sort_by([("round", "ascending"), ("client_id", "ascending")])
    return list(zip(*(table.column(column).to_pylist() for column in ("round", "client_id", *METRICS))))


def test_a_run_records_which_clients_share_each_host(tmp_path: Path) -> None:
    run_dir = _stopped_run(tmp_path, batched=True)
    assert _manifest(run_dir)["host_layout"] == {"hosts": 2, "clients": [[[0, 3]], [[4, 7]]], "batched_training": True}


def test_a_batched_resume_on_other_hosts_is_refused_naming_the_key(tmp_path: Path) -> None:
    run_dir = _stopped_run(tmp_path, batched=True)
    before = (run_dir / "manifest.json").read_bytes()
    result = runner.invoke(app, ["simulate", "--resume", str(run_dir), "--set", "runtime.num_cpus=1", "-q"])
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    assert "runtime.num_cpus: 2 -> 1" in message
    assert "started with 2 hosts: clients 0-3; 4-7" in message and "now 1 host: clients 0-7" in message
    assert "--allow-layout-change" in message
    assert (run_dir / "manifest.json").read_bytes() == before  # refused before anything ran or was written


def test_an_allowed_layout_change_is_recorded_and_marked_in_the_report(tmp_path: Path) -> None:
    run_dir = _stopped_run(tmp_path, batched=True)
    result = runner.invoke(app, ["simulate", "--resume", str(run_dir), "--set", "runtime.num_cpus=1", "--allow-layout-change", "-q"])
    assert result.exit_code == 0, result.output
    manifest = _manifest(run_dir)
    assert manifest["status"] == "completed"
    [change] = manifest["host_layout_changes"]
    assert change["resumed_at_round"] == 3  # stopped after round 2, its checkpoint written
    assert (change["before"]["hosts"], change["after"]["hosts"]) == (2, 1)
    assert manifest["host_layout"]["hosts"] == 1
    report = runner.invoke(app, ["report", str(tmp_path), "--format", "md"])
    assert report.exit_code == 0, report.output
    assert "[host layout changed (1 of 1 seed)]" in report.output
    assert "[host layout changed] a batched run was resumed with its clients on other hosts" in report.output


def test_allow_layout_change_without_resume_is_refused(tmp_path: Path, write_scenario) -> None:
    result = runner.invoke(app, ["simulate", str(write_scenario(_scenario(True))), "--allow-layout-change", "-q"])
    assert result.exit_code == 2 and "--allow-layout-change goes with --resume" in result.output


def test_an_unbatched_run_resumes_on_other_hosts_with_the_same_bits(tmp_path: Path) -> None:
    reference = tmp_path / "reference"
    run_simulation(prepare_run(build_scenario(_scenario(False))), reference, QuietObserver())
    run_dir = _stopped_run(tmp_path, batched=False)
    result = runner.invoke(app, ["simulate", "--resume", str(run_dir), "--set", "runtime.num_cpus=1", "-q"])
    assert result.exit_code == 0, result.output
    assert "host_layout_changes" not in _manifest(run_dir)
    assert _manifest(run_dir)["host_layout"]["hosts"] == 1
    assert _client_rows(run_dir) == _client_rows(reference)
