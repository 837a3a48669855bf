"""End-to-end runs on Ray: the run directory, its Parquet tables, determinism."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from cli import app
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.terminal.live_view import QuietObserver
from tests.conftest import tiny_scenario

pytestmark = pytest.mark.usefixtures("ray_session")


def simulate(tmp_path: Path, name: str, **changes) -> Path:
    scenario = build_scenario(tiny_scenario(**changes))
    run_dir = tmp_path / name
    run_simulation(prepare_run(scenario), run_dir, QuietObserver())
    return run_dir


def test_hdcfl_run_writes_tables_with_one_row_per_client_per_evaluated_round(tmp_path):
    run_dir = simulate(tmp_path, "hdcfl")
    clients = pq.read_table(run_dir / "clients.parquet").to_pydict()
    rounds = pq.read_table(run_dir / "rounds.parquet").to_pydict()
    refresh = pq.read_table(run_dir / "refresh.parquet").to_pydict()

    pairs = sorted(zip(clients["round"], clients["client_id"]))
    assert pairs == [(r, k) for r in (1, 2, 3) for k in range(8)]
    assert all(0.0 <= a <= 1.0 for a in clients["accuracy"])
    assert all(n > 0 for n in clients["num_samples"])
    assert rounds["round"] == [1, 2, 3]
    for column in ("mean_accuracy", "worst_accuracy", "bottom20_accuracy", "gap", "wall_time_s"):
        assert all(np.isfinite(rounds[column])), column
    assert all(w <= b20 <= m for w, b20, m in zip(rounds["worst_accuracy"], rounds["bottom20_accuracy"], rounds["mean_accuracy"]))
    # activation round 2, refresh every round after it
    assert refresh["round"] == [2, 3]
    for column in ("silhouette", "ari_previous", "membership_entropy", "personalization_gain"):
        assert column in refresh
    # round 1 is scored with the global encoder, later rounds with the personalised mixture
    by_round = {r: ref for r, ref in zip(clients["round"], clients["reference"])}
    assert by_round[1] == "global" and by_round[3] == "personalized"

    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "completed" and manifest["seed"] == 7
    assert "torch" in manifest["packages"]
    resolved = yaml.safe_load((run_dir / "scenario.yaml").read_text())
    assert resolved["algorithm"]["name"] == "hdcfl" and resolved["protocol"]["rounds"] == 3


def test_same_scenario_and_seed_give_identical_client_metrics(tmp_path):
    changes = {"partition": {"num_clients": 6}, "protocol": {"participation": 0.5}}
    first = pq.read_table(simulate(tmp_path, "a", **changes) / "clients.parquet").sort_by([("round", "ascending"), ("client_id", "ascending")])
    second = pq.read_table(simulate(tmp_path, "b", **changes) / "clients.parquet").sort_by([("round", "ascending"), ("client_id", "ascending")])
    for column in ("accuracy", "loss", "accuracy_global", "accuracy_local", "train_loss", "memberships", "group"):
        assert first.column(column).to_pylist() == second.column(column).to_pylist(), column


def test_one_prototype_with_full_participation_equals_the_global_encoder(tmp_path):
    run_dir = simulate(tmp_path, "one-prototype", algorithm={"name": "hdcfl", "hdcfl": {"groups": 1, "activation_round": 2, "refresh_every": 1}})
    clients = pq.read_table(run_dir / "clients.parquet").to_pydict()
    late = [i for i, r in enumerate(clients["round"]) if r >= 2]
    assert late
    for i in late:
        assert clients["accuracy_personalized"][i] == pytest.approx(clients["accuracy_global"][i], abs=1e-9)


def test_fedavg_se_scores_the_global_encoder_and_writes_no_refresh_table(tmp_path):
    run_dir = simulate(tmp_path, "fedavg", algorithm={"name": "fedavg_se"})
    clients = pq.read_table(run_dir / "clients.parquet").to_pydict()
    assert set(clients["reference"]) == {"global"}
    assert clients["accuracy"] == clients["accuracy_global"]
    assert not (run_dir / "refresh.parquet").exists()


def test_cli_simulate_quiet_prints_the_run_dir(tmp_path, write_scenario):
    path = write_scenario(tiny_scenario(protocol={"rounds": 2}))
    run_dir = tmp_path / "cli-run"
    result = CliRunner().invoke(app, ["simulate", str(path), "--out", str(run_dir), "--quiet", "--set", "algorithm.name=fedavg_se"])
    assert result.exit_code == 0, result.output
    assert str(run_dir) in result.output
    assert pq.read_table(run_dir / "rounds.parquet").num_rows == 2


def test_simulate_refuses_a_run_dir_that_holds_files(tmp_path, write_scenario):
    run_dir = tmp_path / "used"
    run_dir.mkdir()
    (run_dir / "clients.parquet").mkdir()
    result = CliRunner().invoke(app, ["simulate", str(write_scenario(tiny_scenario())), "--out", str(run_dir), "--quiet"])
    assert result.exit_code == 2
    assert "already holds files" in result.output


def test_report_reads_the_run_and_writes_tables_and_figures(tmp_path):
    run_dir = simulate(tmp_path, "for-report")
    figures = tmp_path / "figures"
    out = tmp_path / "report.md"
    result = CliRunner().invoke(app, ["report", str(run_dir), "--format", "md", "--out", str(out), "--figures", str(figures)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert "| hdcfl |" in text and "Avg. rank" in text
    names = {path.name for path in figures.iterdir()}
    assert {"learning_curves_tiny.png", "grouping_tiny.png", "clients_tiny.png", "memberships_tiny_hdcfl_seed7.png"} <= names
    assert all(path.stat().st_size > 1000 for path in figures.iterdir())
