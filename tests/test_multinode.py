"""Placement across two Ray nodes with half a CPU per host actor,
and the same per-client metrics as a run in one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hdcfl_ray.config.loading import load_scenario
from hdcfl_ray.logs.table_writer import read_table
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from tests.conftest import tiny_scenario

REPO = Path(__file__).resolve().parents[1]


def _metrics(run_dir: Path) -> list[tuple]:
    clients = read_table(run_dir, "clients").to_pydict()
    columns = ["round", "client_id", "accuracy", "loss", "train_loss", "group"]
    return sorted(zip(*(clients[column] for column in columns)), key=lambda row: (row[0], row[1]))


@pytest.mark.slow  # a long end-to-end run: the slow tier (.ci/run runs it after the README's command)
def test_hosts_spread_over_two_nodes_and_metrics_match_one_process(tmp_path: Path, write_scenario) -> None:
    data = tiny_scenario(
        runtime={"clients_per_actor": 2, "num_cpus_per_actor": 0.5},
        protocol={"rounds": 3, "participation": 0.75, "local_epochs": 1, "batch_size": 32},
    )
    path = write_scenario(data)
    result_path = tmp_path / "result.json"
    environment = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    completed = subprocess.run(
        [sys.executable, "-m", "tests.multinode_run", str(path), str(tmp_path / "cluster-run"), str(result_path)],
        cwd=REPO, env=environment, capture_output=True, text=True, timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    result = json.loads(result_path.read_text())
    manifest = result["manifest"]
    assert manifest["runtime"]["backend"] == "ray" and manifest["runtime"]["nodes"] == 2
    assert manifest["num_client_hosts"] == 4
    assert manifest["runtime"]["torch_threads_per_host"] == 1  # half a CPU still trains on one thread
    # two half-CPU hosts per one-CPU node: the four hosts must use both nodes
    assert sorted(set(manifest["client_host_nodes"])) == result["cluster_nodes"]

    # Bit-identical results need the same torch thread count (a matmul's reduction
    # order depends on it): each cluster host trains on one thread, so the
    # in-process run gets one CPU too.
    local = load_scenario(path, overrides=["runtime.backend=local", "runtime.num_cpus=1"])
    run_simulation(prepare_run(local), tmp_path / "local-run")
    cluster_rows, local_rows = _metrics(tmp_path / "cluster-run"), _metrics(tmp_path / "local-run")
    assert len(cluster_rows) == 8 * 3
    assert cluster_rows == local_rows
    local_manifest = json.loads((tmp_path / "local-run" / "manifest.json").read_text())
    assert local_manifest["runtime"]["torch_threads_per_host"] == 1
