"""A client host actor killed mid-run is restarted with its clients' states; results do not change."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.terminal.live_view import QuietObserver
from tests.conftest import slow_beyond, tiny_scenario

pytestmark = pytest.mark.usefixtures("ray_session")

METRICS = ("accuracy", "loss", "accuracy_global", "accuracy_local", "train_loss", "group", "memberships")


class KillHostAfterRound(QuietObserver):
    def __init__(self, round_index: int, host_index: int) -> None:
        self.round_index = round_index
        self.host_index = host_index
        self.run_dir: Path | None = None
        self.killed = False

    def on_start(self, scenario, run_dir, num_hosts):
        self.run_dir = run_dir

    def on_round(self, round_row, refresh_row, events):
        import ray

        if round_row["round"] == self.round_index:
            names = json.loads((self.run_dir / "manifest.json").read_text())["client_host_actors"]
            ray.kill(ray.get_actor(names[self.host_index]), no_restart=False)
            self.killed = True


def client_metrics(run_dir: Path):
    table = pq.read_table(run_dir / "clients.parquet").sort_by([("round", "ascending"), ("client_id", "ascending")])
    return {column: table.column(column).to_pylist() for column in METRICS}


@pytest.mark.parametrize("mode", slow_beyond(["sync", "async", "sync-batched"], fast={"sync"}))
def test_killing_a_client_host_mid_run_leaves_the_metrics_unchanged(tmp_path, mode):
    """sync-batched: the dead host's clients trained together are redone together, so
    they get the same bits."""
    protocol = {"rounds": 4, "participation": 0.5}
    if mode == "async":
        protocol.update(mode="async", asynchronous={"concurrency": 3}, system={"speed": {"kind": "lognormal", "mean": 4.0}})
    runtime = {"batched_training": True} if mode == "sync-batched" else {}
    scenario = build_scenario(
        tiny_scenario(protocol=protocol, runtime=runtime, algorithm={"name": "hdcfl", "hdcfl": {"groups": 2, "activation_round": 2, "refresh_every": 1}})
    )
    reference_dir = tmp_path / "reference"
    run_simulation(prepare_run(scenario), reference_dir, QuietObserver())

    killer = KillHostAfterRound(round_index=2, host_index=0)
    killed_dir = tmp_path / "killed"
    run_simulation(prepare_run(scenario), killed_dir, killer)
    assert killer.killed
    assert client_metrics(killed_dir) == client_metrics(reference_dir)
    events = pq.read_table(killed_dir / "events.parquet").column("message").to_pylist()
    assert any(message.startswith("client host 0 ") for message in events), events
