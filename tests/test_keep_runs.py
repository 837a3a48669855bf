"""Keeping a long comparison's finished runs in the repository: completed runs are kept
without checkpoints, and on request the stopped ones with theirs; restoring fills in what
the runs folder lacks; neither mixes runs made from two different pretrained weights files."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from tests.script_modules import REPOSITORY, load_script

keep_runs = load_script(REPOSITORY / "scenarios" / "cpu" / "paper-size" / "keep_runs.py", "keep_runs")


def write_run(root: Path, method: str, seed: int, status: str, weights_bytes: bytes = b"pool-a", rounds: int = 1) -> Path:
    run_dir = root / "setting" / method / f"seed{seed}"
    (run_dir / "checkpoint").mkdir(parents=True, exist_ok=True)
    (run_dir / "checkpoint" / "arrays.npz").write_bytes(b"large")
    (run_dir / "clients.parquet").mkdir(exist_ok=True)
    (run_dir / "clients.parquet" / "part-000001.parquet").write_bytes(b"rows")
    (run_dir / "rounds.parquet").mkdir(exist_ok=True)
    for round_index in range(1, rounds + 1):
        (run_dir / "rounds.parquet" / f"part-{round_index:06d}.parquet").write_bytes(b"round")
    (run_dir / ".lock").write_text("1234")
    digest = hashlib.sha256(weights_bytes).hexdigest()
    (run_dir / "manifest.json").write_text(json.dumps({"status": status, "initialisation": {"sha256": digest}}))
    return run_dir


def test_save_keeps_completed_runs_without_checkpoints_and_the_weights(tmp_path):
    runs, kept, weights = tmp_path / "runs" / "rot", tmp_path / "results" / "rot", tmp_path / "weights.pt"
    weights.write_bytes(b"pool-a")
    write_run(runs, "hdcfl", 42, "completed")
    write_run(runs, "ifca", 42, "running")  # killed: its checkpoints stay where they are
    saved = keep_runs.save(runs, kept, weights)
    assert saved == [kept / "setting" / "hdcfl" / "seed42"]
    assert (saved[0] / "clients.parquet" / "part-000001.parquet").read_bytes() == b"rows"
    assert not (saved[0] / "checkpoint").exists()
    assert not (kept / "setting" / "ifca").exists()
    assert (tmp_path / "results" / keep_runs.WEIGHTS_NAME).read_bytes() == b"pool-a"
    assert keep_runs.save(runs, kept, weights) == []  # a second save copies nothing again


def test_restore_fills_in_only_the_runs_the_folder_lacks_and_the_weights(tmp_path):
    kept, runs, weights = tmp_path / "results" / "rot", tmp_path / "runs" / "rot", tmp_path / "weights" / "pool.pt"
    write_run(kept, "hdcfl", 42, "completed")
    write_run(kept, "local", 42, "completed")
    (tmp_path / "results" / keep_runs.WEIGHTS_NAME).write_bytes(b"pool-a")
    on_disk = write_run(runs, "local", 42, "running")
    restored = keep_runs.restore(kept, runs, weights)
    assert restored == [runs / "setting" / "hdcfl" / "seed42"]
    assert json.loads((on_disk / "manifest.json").read_text())["status"] == "running"  # the sweep resumes it
    assert weights.read_bytes() == b"pool-a"


def test_restore_refuses_a_different_weights_file(tmp_path):
    kept, runs, weights = tmp_path / "results" / "rot", tmp_path / "runs" / "rot", tmp_path / "pool.pt"
    write_run(kept, "hdcfl", 42, "completed")
    (tmp_path / "results" / keep_runs.WEIGHTS_NAME).write_bytes(b"pool-a")
    weights.write_bytes(b"pool-b")
    with pytest.raises(keep_runs.KeepError, match="two pretrainings"):
        keep_runs.restore(kept, runs, weights)
    assert not runs.exists()


def test_save_refuses_runs_from_other_weights_than_the_kept_file(tmp_path, capsys):
    runs, kept = tmp_path / "runs" / "rot", tmp_path / "results" / "rot"
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / keep_runs.WEIGHTS_NAME).write_bytes(b"pool-a")
    write_run(runs, "hdcfl", 42, "completed", weights_bytes=b"pool-b")
    code = keep_runs.main(["save", "rot", "--runs", str(tmp_path / "runs"), "--kept", str(tmp_path / "results"), "--weights", str(tmp_path / "w.pt")])
    assert code == 2
    assert "started from other weights" in capsys.readouterr().err
    assert not kept.exists()


def test_save_stopped_keeps_unfinished_runs_with_checkpoints_and_replaces_them_when_further_along(tmp_path):
    runs, kept, weights = tmp_path / "runs" / "rot", tmp_path / "results" / "rot", tmp_path / "weights.pt"
    write_run(runs, "ifca", 42, "running", rounds=30)
    early = write_run(runs, "fedsoft", 42, "interrupted", rounds=5)
    shutil.rmtree(early / "checkpoint")  # stopped before its first checkpoint: nothing to resume from
    saved = keep_runs.save(runs, kept, weights, stopped=True)
    assert saved == [kept / "setting" / "ifca" / "seed42"]
    assert (saved[0] / "checkpoint" / "arrays.npz").read_bytes() == b"large"  # the next machine resumes from it
    assert not (saved[0] / ".lock").exists()
    assert keep_runs.save(runs, kept, weights, stopped=True) == []  # no further along: nothing copied
    write_run(runs, "ifca", 42, "running", rounds=50)
    assert keep_runs.save(runs, kept, weights, stopped=True) == saved
    assert keep_runs.rounds_done(saved[0]) == 50
    write_run(runs, "ifca", 42, "completed", rounds=90)
    assert keep_runs.save(runs, kept, weights) == saved  # finished: replaces the stopped copy, without checkpoints
    assert not (saved[0] / "checkpoint").exists()
    assert keep_runs.save(runs, kept, weights, stopped=True) == []


def test_restore_brings_back_a_kept_stopped_run_for_the_sweep_to_resume(tmp_path):
    kept, runs, weights = tmp_path / "results" / "rot", tmp_path / "runs" / "rot", tmp_path / "weights" / "pool.pt"
    write_run(kept, "ifca", 42, "running", rounds=30)
    restored = keep_runs.restore(kept, runs, weights)
    assert restored == [runs / "setting" / "ifca" / "seed42"]
    assert (restored[0] / "checkpoint" / "arrays.npz").is_file()
