"""Sweeps: grid expansion, the index, skipping finished runs after a crash."""

from __future__ import annotations

import json

import pytest

from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.sweep.grid import SweepPlan, expand, read_sweep_file
from hdcfl_ray.sweep.runner import run_sweep
from tests.conftest import tiny_scenario


def plan_for(path, out, algorithms=("fedavg_se", "hdcfl"), seeds=(1, 2)):
    return SweepPlan((path,), algorithms, seeds, ("protocol.rounds=2",), out)


def test_grid_expands_every_algorithm_and_seed_with_its_own_folder(write_scenario, tmp_path):
    runs = expand(plan_for(write_scenario(tiny_scenario()), tmp_path / "sweep"))
    assert [(r.algorithm, r.seed) for r in runs] == [("fedavg_se", 1), ("fedavg_se", 2), ("hdcfl", 1), ("hdcfl", 2)]
    assert all(r.scenario.protocol.rounds == 2 for r in runs)
    assert runs[3].run_dir == tmp_path / "sweep" / "tiny" / "hdcfl" / "seed2"
    assert runs[3].scenario.seed == 2 and runs[3].scenario.algorithm.name == "hdcfl"


def test_unknown_algorithm_in_a_sweep_is_refused(write_scenario, tmp_path):
    with pytest.raises(ScenarioError, match="fedmagic"):
        expand(plan_for(write_scenario(tiny_scenario()), tmp_path, algorithms=("fedmagic",)))


def test_sweep_file_lists_scenarios_relative_to_itself(write_scenario, tmp_path):
    write_scenario(tiny_scenario(), name="one.yaml")
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text("scenarios: [one.yaml]\nalgorithms: [fedavg_se]\nseeds: [5]\nset: {protocol.rounds: 2}\nout: out\n")
    plan = read_sweep_file(sweep_file, None)
    (run,) = expand(plan)
    assert run.scenario.protocol.rounds == 2 and run.seed == 5


@pytest.mark.usefixtures("ray_session")
def test_a_sweep_rerun_after_a_crash_completes_only_the_missing_runs(write_scenario, tmp_path):
    out = tmp_path / "sweep"
    runs = expand(plan_for(write_scenario(tiny_scenario()), out))
    first = run_sweep(runs[:2], out, runs[0].scenario.runtime)  # "crash" after two of four runs
    assert sorted(first.completed) == sorted(r.key for r in runs[:2])
    stamps = {r.key: (r.run_dir / "manifest.json").stat().st_mtime_ns for r in runs[:2]}

    second = run_sweep(runs, out, runs[0].scenario.runtime)
    assert sorted(second.skipped) == sorted(r.key for r in runs[:2])
    assert sorted(second.completed) == sorted(r.key for r in runs[2:])
    assert all((r.run_dir / "manifest.json").stat().st_mtime_ns == stamps[r.key] for r in runs[:2])
    index = json.loads((out / "index.json").read_text())["runs"]
    assert len(index) == 4 and {entry["status"] for entry in index} == {"completed"}


@pytest.mark.usefixtures("ray_session")
def test_sweep_command_writes_its_report(write_scenario, tmp_path):
    from typer.testing import CliRunner

    from cli import app

    path = write_scenario(tiny_scenario(algorithm={"name": "fedavg_se"}, protocol={"rounds": 1}))
    report = tmp_path / "docs" / "table.md"
    result = CliRunner().invoke(app, ["sweep", str(path), "--seeds", "3", "--out", str(tmp_path / "sweep"), "--report", str(report)])
    assert result.exit_code == 0, result.output
    assert "| fedavg_se |" in report.read_text()


def test_a_sweep_whose_ray_cluster_dies_stops_and_stays_resumable(tmp_path, monkeypatch) -> None:
    import hdcfl_ray.sweep.runner as runner
    from hdcfl_ray.config.loading import build_scenario
    from hdcfl_ray.sweep.grid import SweepRun
    from tests.conftest import tiny_scenario

    class DyingCluster:
        cpus_left = 2.0

        def __init__(self, runtime) -> None:
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            pass

        @property
        def cpus(self) -> float:
            return DyingCluster.cpus_left

    attempted: list[str] = []

    def simulate(prepared, run_dir, observer, resume=False):
        attempted.append(str(run_dir))
        DyingCluster.cpus_left = 0.0  # e.g. `ray stop` from another terminal
        raise RuntimeError("actor died")

    monkeypatch.setattr(runner, "RaySession", DyingCluster)
    monkeypatch.setattr(runner, "run_simulation", simulate)
    monkeypatch.setattr(runner, "prepare_run", lambda scenario, dataset: None)
    monkeypatch.setattr(runner.DatasetCache, "get", lambda self, scenario: None)
    scenario = build_scenario(tiny_scenario())
    runs = [SweepRun("tiny", "hdcfl", seed, scenario, tmp_path / f"seed{seed}") for seed in (1, 2, 3)]
    with pytest.raises(runner.ClusterLostError, match="rerun the same command"):
        runner.run_sweep(runs, tmp_path, scenario.runtime, parallel=1)
    assert len(attempted) == 1  # the other runs were not started into a dead cluster
    index = json.loads((tmp_path / "index.json").read_text())
    assert {entry["status"] for entry in index["runs"]} == {"pending"}
