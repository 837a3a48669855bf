"""Sweeps: grid expansion, the index, skipping finished runs after a crash."""

from __future__ import annotations

import json

import pytest

from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.sweeps.grid import SweepPlan, expand, read_sweep_file
from hdcfl_ray.sweeps.runner import run_sweep
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



def test_a_second_sweep_into_the_same_folder_keeps_the_first_ones_index_entries(write_scenario, tmp_path):
    """Two method lists run as two sweeps into one folder: the index lists all four runs."""
    from hdcfl_ray.sweeps.index import write_index

    out = tmp_path / "sweep"
    runs = expand(plan_for(write_scenario(tiny_scenario()), out))
    write_index(out, runs[:2], {run.key: "completed" for run in runs[:2]})
    write_index(out, runs[1:], {runs[1].key: "completed"})  # fedavg_se seed 2 again, then hdcfl
    index = json.loads((out / "index.json").read_text())["runs"]
    assert [(entry["algorithm"], entry["seed"], entry["status"]) for entry in index] == [
        ("fedavg_se", 1, "completed"),
        ("fedavg_se", 2, "completed"),
        ("hdcfl", 1, "pending"),
        ("hdcfl", 2, "pending"),
    ]
    (out / "index.json").write_text("{not json")  # a damaged listing is rebuilt, not fatal
    write_index(out, runs[:1], {})
    assert len(json.loads((out / "index.json").read_text())["runs"]) == 1


@pytest.mark.slow  # a long end-to-end run: the slow tier (.ci/run runs it after the README's command)
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
    import hdcfl_ray.sweeps.runner as runner
    from hdcfl_ray.config.loading import build_scenario
    from hdcfl_ray.sweeps.grid import SweepRun
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

    def simulate(prepared, run_dir, observer, resume=False, auto_knobs_dir=None):
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


# --- a rerun never mixes settings -----------------------------------------------


def _fabricate_runs(runs, status="completed"):
    """Run folders as a finished (or killed) earlier sweep leaves them, without running."""
    from hdcfl_ray.config.loading import scenario_to_yaml

    for run in runs:
        run.run_dir.mkdir(parents=True)
        (run.run_dir / "scenario.yaml").write_text(scenario_to_yaml(run.scenario))
        (run.run_dir / "manifest.json").write_text(json.dumps({"status": status}))
        if status != "completed":
            (run.run_dir / "rounds.parquet").mkdir()


def _plan(path, out, *overrides):
    return SweepPlan((path,), ("fedavg_se", "hdcfl"), (1, 2), ("protocol.rounds=3", *overrides), out)


def test_a_rerun_with_more_rounds_over_a_finished_sweep_stops_with_exit_2_and_lists_the_key(write_scenario, tmp_path):
    from typer.testing import CliRunner

    from cli import app

    path = write_scenario(tiny_scenario())
    out = tmp_path / "sw"
    _fabricate_runs(expand(_plan(path, out)))
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    result = CliRunner().invoke(
        app, ["sweep", str(path), "--algorithms", "fedavg_se,hdcfl", "--seeds", "1,2", "--set", "protocol.rounds=4", "--out", str(out)]
    )
    assert result.exit_code == 2, result.output
    assert result.output.count("protocol.rounds: 3 -> 4") == 4
    for key in ("tiny/fedavg_se/seed1", "tiny/fedavg_se/seed2", "tiny/hdcfl/seed1", "tiny/hdcfl/seed2"):
        assert key in result.output
    assert "--replace-changed" in result.output and "skipped" not in result.output
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before  # nothing ran, nothing was written


def test_a_killed_run_is_not_resumed_with_another_learning_rate(write_scenario, tmp_path):
    from hdcfl_ray.sweeps.changes import SettingsChangedError

    path = write_scenario(tiny_scenario())
    out = tmp_path / "sw"
    _fabricate_runs(expand(_plan(path, out))[:1], status="running")  # killed after round 2
    runs = expand(_plan(path, out, "protocol.optimizer.lr=0.01"))
    with pytest.raises(SettingsChangedError) as caught:
        run_sweep(runs, out, runs[0].scenario.runtime)
    message = str(caught.value)
    assert "tiny/fedavg_se/seed1 (partial" in message and "protocol.optimizer.lr: 0.05 -> 0.01" in message
    assert "tiny/hdcfl" not in message  # runs not on disk yet are not in the way


@pytest.mark.parametrize(
    "override", ["runtime.precision=bf16", "runtime.channels_last=true", "runtime.torch_threads=2", "runtime.num_cpus_per_actor=2"]
)
def test_a_runtime_key_that_changes_the_arithmetic_is_a_change(write_scenario, tmp_path, override):
    from hdcfl_ray.sweeps.changes import SettingsChangedError

    path = write_scenario(tiny_scenario())
    out = tmp_path / "sw"
    _fabricate_runs(expand(_plan(path, out))[:1], status="running")
    runs = expand(_plan(path, out, override))
    with pytest.raises(SettingsChangedError) as caught:
        run_sweep(runs, out, runs[0].scenario.runtime)
    # num_cpus_per_actor changes the threads each host trains with ("auto"): named as that
    assert override.partition("=")[0].replace("num_cpus_per_actor", "torch_threads") in str(caught.value)


def _rerun_over_finished_runs_skips_them_all(write_scenario, tmp_path, monkeypatch, *overrides: str) -> None:
    """Finished runs on disk, then a rerun with `overrides`: every run is skipped, none run."""
    import hdcfl_ray.sweeps.runner as runner

    path = write_scenario(tiny_scenario())
    out = tmp_path / "sw"
    _fabricate_runs(expand(_plan(path, out)))
    monkeypatch.setattr(runner, "RaySession", None)  # a sweep with nothing to do starts no cluster
    runs = expand(_plan(path, out, *overrides))
    outcome = run_sweep(runs, out, runs[0].scenario.runtime)
    assert sorted(outcome.skipped) == sorted(run.key for run in runs) and not outcome.completed


def test_runtime_keys_checkpoint_frequency_and_output_dir_may_differ_on_a_rerun(write_scenario, tmp_path, monkeypatch):
    _rerun_over_finished_runs_skips_them_all(
        write_scenario,
        tmp_path,
        monkeypatch,
        # the thread count stays 1: runtime.torch_threads is compared as resolved ("auto" = num_cpus_per_actor)
        "runtime.num_cpus_per_actor=2",
        "runtime.torch_threads=1",
        "runtime.backend=local",
        "checkpoint.every=1",
        "output.dir=elsewhere",
    )


def test_another_methods_settings_do_not_count_as_a_change_of_a_finished_run(write_scenario, tmp_path, monkeypatch):
    # an IFCA and a PACFL calibration, written into the scenario file after the fedavg_se/hdcfl runs finished
    _rerun_over_finished_runs_skips_them_all(write_scenario, tmp_path, monkeypatch, "algorithm.ifca.clusters=8", "algorithm.pacfl.threshold=2.5")


def test_a_run_folder_whose_scenario_cannot_be_read_is_listed_as_changed(write_scenario, tmp_path):
    from hdcfl_ray.sweeps.changes import SettingsChangedError

    path = write_scenario(tiny_scenario())
    out = tmp_path / "sw"
    runs = expand(_plan(path, out))
    _fabricate_runs(runs[:1])
    (runs[0].run_dir / "scenario.yaml").write_text("name: tiny\nnot_a_key: 1\n")
    with pytest.raises(SettingsChangedError, match="not readable as a scenario"):
        run_sweep(runs, out, runs[0].scenario.runtime)


def test_a_damaged_manifest_in_a_sweep_folder_is_named_before_anything_runs(write_scenario, tmp_path):
    path = write_scenario(tiny_scenario())
    out = tmp_path / "sw"
    runs = expand(_plan(path, out))
    _fabricate_runs(runs[:1])
    (runs[0].run_dir / "manifest.json").write_text('{"status": "compl')
    with pytest.raises(ScenarioError, match="manifest.json: damaged manifest") as caught:
        run_sweep(runs, out, runs[0].scenario.runtime)
    assert str(runs[0].run_dir / "manifest.json") in str(caught.value) and "rerun the sweep" in str(caught.value)


class _FakeCluster:
    def __init__(self, runtime) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    cpus = 2.0


def _record_runs(monkeypatch):
    import hdcfl_ray.sweeps.runner as runner

    started: list[tuple[str, bool, bool]] = []

    def simulate(prepared, run_dir, observer, resume=False, auto_knobs_dir=None):
        started.append((str(run_dir), resume, run_dir.exists() and any(run_dir.iterdir())))

    monkeypatch.setattr(runner, "RaySession", _FakeCluster)
    monkeypatch.setattr(runner, "run_simulation", simulate)
    monkeypatch.setattr(runner, "prepare_run", lambda scenario, dataset: None)
    monkeypatch.setattr(runner.DatasetCache, "get", lambda self, scenario: None)
    return started


def test_replace_changed_moves_the_old_runs_beside_the_sweep_folder_and_starts_them_afresh(write_scenario, tmp_path, monkeypatch):
    started = _record_runs(monkeypatch)
    path = write_scenario(tiny_scenario())
    out = tmp_path / "sw"
    _fabricate_runs(expand(_plan(path, out)))
    runs = expand(_plan(path, out, "protocol.rounds=4"))
    notes: list[str] = []
    outcome = run_sweep(runs, out, runs[0].scenario.runtime, parallel=1, on_progress=lambda key, status: notes.append(status), replace_changed=True)
    assert sorted(outcome.completed) == sorted(run.key for run in runs)
    assert all(not resume and not occupied for _, resume, occupied in started)  # fresh runs into empty folders
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("sw.replaced-")]
    moved = aside / "tiny" / "hdcfl" / "seed2" / "scenario.yaml"
    assert "rounds: 3" in moved.read_text()
    assert sum("the old run moved to" in note for note in notes) == 4


def test_a_run_killed_before_it_began_is_started_afresh(write_scenario, tmp_path, monkeypatch):
    from hdcfl_ray.config.loading import scenario_to_yaml

    started = _record_runs(monkeypatch)
    path = write_scenario(tiny_scenario())
    out = tmp_path / "sw"
    (run,) = expand(SweepPlan((path,), ("hdcfl",), (1,), (), out))
    run.run_dir.mkdir(parents=True)
    (run.run_dir / "scenario.yaml").write_text(scenario_to_yaml(run.scenario))  # killed before its manifest
    run_sweep([run], out, run.scenario.runtime)
    assert started == [(str(run.run_dir), False, False)]


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_a_killed_sweep_rerun_with_unchanged_settings_resumes_to_the_uninterrupted_rows(write_scenario, tmp_path):
    import pyarrow.parquet as pq

    from hdcfl_ray.runtime.driver import prepare_run, run_simulation
    from tests.test_checkpoint_resume import METRICS, StopAfterRound

    path = write_scenario(tiny_scenario(protocol={"rounds": 4}, checkpoint={"every": 1}))
    (run,) = expand(SweepPlan((path,), ("hdcfl",), (1,), (), tmp_path / "sw"))
    reference = tmp_path / "reference"
    run_simulation(prepare_run(run.scenario), reference)
    with pytest.raises(KeyboardInterrupt):
        run_simulation(prepare_run(run.scenario), run.run_dir, StopAfterRound(2))
    outcome = run_sweep([run], tmp_path / "sw", run.scenario.runtime)
    assert outcome.completed == [run.key]
    keys = [("round", "ascending"), ("client_id", "ascending")]
    ref = pq.read_table(reference / "clients.parquet").sort_by(keys)
    got = pq.read_table(run.run_dir / "clients.parquet").sort_by(keys)
    assert got.num_rows == ref.num_rows
    for column in METRICS:
        assert got.column(column).to_pylist() == ref.column(column).to_pylist(), column
