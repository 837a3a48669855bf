"""The local backend's hosts side by side, a thread each: as many hosts as the run's
CPUs hold, the same per-client metrics as one host, and a host's thread count set
on its own thread."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.logs.table_writer import read_table
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.terminal.live_view import QuietObserver
from tests.conftest import tiny_scenario

COLUMNS = ["round", "client_id", "accuracy", "loss", "train_loss", "group"]


def _rows(run_dir: Path) -> list[tuple]:
    clients = read_table(run_dir, "clients").to_pydict()
    return sorted(zip(*(clients[column] for column in COLUMNS)))


@pytest.mark.parametrize("method", ["hdcfl", "ifca", "fedala"])
def test_two_threaded_hosts_give_the_bits_of_one(tmp_path: Path, method: str) -> None:
    algorithm = {"name": method, "hdcfl": {"groups": 2, "activation_round": 1, "refresh_every": 1}, "ifca": {"clusters": 2}}
    runs = {}
    for cpus in (1, 2):
        scenario = build_scenario(
            tiny_scenario(algorithm=algorithm, runtime={"backend": "local", "num_cpus": cpus}, protocol={"rounds": 2, "participation": 0.75})
        )
        run_dir = tmp_path / f"cpus{cpus}"
        run_simulation(prepare_run(scenario), run_dir, QuietObserver())
        runs[cpus] = run_dir
    manifest = json.loads((runs[2] / "manifest.json").read_text())
    assert manifest["num_client_hosts"] == 2 and manifest["client_host_actors"] == ["in-process-0", "in-process-1"]
    assert all(host["torch_threads"] == 1 for host in manifest["client_host_hardware"])
    assert json.loads((runs[1] / "manifest.json").read_text())["num_client_hosts"] == 1
    assert _rows(runs[2]) == _rows(runs[1])


def test_two_threads_per_host_leave_one_host_on_two_cpus(tmp_path: Path) -> None:
    scenario = build_scenario(
        tiny_scenario(algorithm={"name": "fedavg"}, runtime={"backend": "local", "num_cpus": 2, "torch_threads": 2}, protocol={"rounds": 1})
    )
    run_simulation(prepare_run(scenario), tmp_path / "run", QuietObserver())
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["num_client_hosts"] == 1 and manifest["client_host_hardware"][0]["torch_threads"] == 2


def test_a_host_thread_trains_with_the_hosts_thread_count() -> None:
    import threading

    import torch

    from hdcfl_ray.runtime.backends.local_host import in_process_run

    scenario = build_scenario(tiny_scenario(algorithm={"name": "fedavg"}, runtime={"torch_threads": 1}, protocol={"rounds": 1}))
    run = in_process_run(prepare_run(scenario), hosts=2)
    seen = {}

    def probe() -> None:
        run.hosts[0].bind_thread()
        seen["threads"] = torch.get_num_threads()

    torch.set_num_threads(2)
    thread = threading.Thread(target=probe)
    thread.start()
    thread.join()
    run.close()
    assert seen["threads"] == 1
