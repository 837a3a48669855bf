"""Resume refuses what it cannot honour: an edited scenario.yaml (or a --set) that
would change the results, and table parts that are not as the checkpoint recorded
them. It either redoes the damaged round from an older checkpoint, ending equal to
the uninterrupted run, or stops naming the part; it never ends `completed` with a
round missing or unreadable."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from cli import app
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.config.setting_changes import setting_changes
from hdcfl_ray.terminal.live_view import QuietObserver
from tests.conftest import tiny_scenario
from tests.stop_observer import StopAfterRound

runner = CliRunner()
RUN = tiny_scenario(protocol={"rounds": 4}, checkpoint={"every": 1}, runtime={"backend": "local"})
TABLES = ("clients", "rounds", "updates", "refresh")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    path = tmp_path_factory.mktemp("reference") / "run"
    run_simulation(prepare_run(build_scenario(RUN)), path, QuietObserver())
    return path


@pytest.fixture
def stopped(tmp_path):
    """RUN stopped after round 3: checkpoints of rounds 3 (newest) and 2 (previous)."""
    path = tmp_path / "stopped"
    with pytest.raises(KeyboardInterrupt):
        run_simulation(prepare_run(build_scenario(RUN)), path, StopAfterRound(3))
    return path


def _resume(run_dir, *overrides):
    args = ["simulate", "--resume", str(run_dir), "--quiet"]
    for override in overrides:
        args += ["--set", override]
    return runner.invoke(app, args)


def _status(run_dir):
    return json.loads((run_dir / "manifest.json").read_text())["status"]


def _assert_equal_tables(reference, got):
    for table in TABLES:
        keys = [("round", "ascending")] + ([("client_id", "ascending")] if table == "clients" else [])
        ref = pq.read_table(reference / f"{table}.parquet").sort_by(keys)
        new = pq.read_table(got / f"{table}.parquet").sort_by(keys)
        assert new.num_rows == ref.num_rows, table
        if table == "clients":
            for column in ("round", "client_id", "accuracy", "loss", "group"):
                assert new.column(column).to_pylist() == ref.column(column).to_pylist(), column


def test_the_manifest_and_each_checkpoint_record_the_resolved_scenario(stopped):
    manifest = json.loads((stopped / "manifest.json").read_text())
    state = json.loads((stopped / "checkpoint" / "state.json").read_text())
    assert manifest["scenario_resolved"]["protocol"]["optimizer"]["lr"] == 0.05
    assert manifest["scenario_sha256"] == state["scenario_sha256"] and len(manifest["scenario_sha256"]) == 64
    assert "clients.parquet/part-000003.parquet" in state["tables"]
    assert all(len(entry["sha256"]) == 64 and entry["rows"] > 0 for entry in state["tables"].values())


def test_resume_after_an_edit_of_the_saved_scenario_exits_2_naming_the_key(stopped):
    path = stopped / "scenario.yaml"
    path.write_text(path.read_text().replace("lr: 0.05", "lr: 0.1"))
    result = _resume(stopped)
    assert result.exit_code == 2, result.output
    assert "protocol.optimizer.lr: 0.05 -> 0.1" in result.output and "Traceback" not in result.output
    assert _status(stopped) != "completed"
    assert pq.read_table(stopped / "rounds.parquet").num_rows == 3  # nothing was run


def test_resume_names_every_changed_key(stopped):
    path = stopped / "scenario.yaml"
    path.write_text(path.read_text().replace("lr: 0.05", "lr: 0.1").replace("local_epochs: 1", "local_epochs: 2"))
    result = _resume(stopped)
    assert result.exit_code == 2
    assert "protocol.optimizer.lr" in result.output and "protocol.local_epochs: 1 -> 2" in result.output


def test_resume_with_another_torch_thread_count_is_refused(stopped):
    result = _resume(stopped, "runtime.torch_threads=2")
    assert result.exit_code == 2 and "runtime.torch_threads" in result.output, result.output


def test_an_edit_of_num_cpus_per_actor_that_changes_the_threads_is_named_as_the_thread_count():
    before = build_scenario(tiny_scenario())
    after = build_scenario(tiny_scenario(runtime={"num_cpus_per_actor": 2}))
    pinned = build_scenario(tiny_scenario(runtime={"num_cpus_per_actor": 2, "torch_threads": 1}))
    assert [change.describe() for change in setting_changes(before, after)] == ["runtime.torch_threads: 1 -> 2"]
    assert setting_changes(before, pinned) == []
    gpu = build_scenario(tiny_scenario(runtime={"num_gpus_per_actor": 0.5}))
    # a GPU share moves the host to CUDA, where batched training is on by default: both are named
    assert [change.key for change in setting_changes(before, gpu)] == ["runtime.batched_training", "runtime.num_gpus_per_actor"]


def test_one_data_folder_spelled_relative_or_absolute_is_one_setting(tmp_path, monkeypatch):
    data = tmp_path / "data" / "cifar"
    data.mkdir(parents=True)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    absolute = build_scenario(tiny_scenario(dataset={"path": str(data)}))
    relative = build_scenario(tiny_scenario(dataset={"path": "../data/cifar"}))
    assert setting_changes(absolute, relative) == []
    other = build_scenario(tiny_scenario(dataset={"path": "../data"}))
    assert [change.key for change in setting_changes(absolute, other)] == ["dataset.path"]


def test_a_safe_edit_resumes_to_the_uninterrupted_tables(stopped, reference):
    path = stopped / "scenario.yaml"
    assert "num_cpus: null" in path.read_text()
    path.write_text(path.read_text().replace("num_cpus: null", "num_cpus: 1"))
    result = _resume(stopped)
    assert result.exit_code == 0, result.output
    assert _status(stopped) == "completed"
    _assert_equal_tables(reference, stopped)


def _truncate(path):
    size = path.stat().st_size
    with open(path, "r+b") as handle:
        handle.truncate(size // 2)


def test_a_truncated_part_of_the_last_round_is_redone_from_the_previous_checkpoint(stopped, reference):
    part = stopped / "clients.parquet" / "part-000003.parquet"
    _truncate(part)
    result = _resume(stopped)
    assert result.exit_code == 0, result.output
    _assert_equal_tables(reference, stopped)  # every round readable, as if never stopped
    assert str(part) in result.output and "previous checkpoint" in result.output
    manifest = json.loads((stopped / "manifest.json").read_text())
    assert manifest["status"] == "completed" and manifest["resumed_from_round"] == 2


@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_a_damaged_part_both_checkpoints_keep_stops_resume_naming_the_part(stopped, damage):
    part = stopped / "updates.parquet" / "part-000001.parquet"
    _truncate(part) if damage == "truncate" else os.remove(part)
    result = _resume(stopped)
    assert result.exit_code == 2, result.output
    assert str(part) in result.output and ("missing" in result.output) == (damage == "delete")
    assert "Traceback" not in result.output and _status(stopped) != "completed"
