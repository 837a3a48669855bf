"""Replaying a finished HDC-FL run's refreshes with other settings (hdcfl_ray/ablation)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from analysis.runs import load_run
from hdcfl_ray.ablation import ablate_run
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.logs.table_writer import read_table
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.terminal.live_view import QuietObserver
from tests.conftest import tiny_scenario

pytestmark = pytest.mark.usefixtures("ray_session")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, ray_session) -> Path:
    """One small HDC-FL run with saved refresh caches; partial participation leaves
    some clients untrained at the first refresh (they hold the initial head)."""
    scenario = build_scenario(
        tiny_scenario(output={"save_refresh_cache": True}, protocol={"rounds": 3, "participation": 0.5, "local_epochs": 1, "batch_size": 32})
    )
    run_dir = tmp_path_factory.mktemp("ablate") / "run"
    run_simulation(prepare_run(scenario), run_dir, QuietObserver())
    return run_dir


def _by_round_and_client(run_dir: Path) -> dict[tuple[int, int], dict]:
    return {(row["round"], row["client_id"]): row for row in read_table(run_dir, "clients").to_pylist()}


def _refresh_rounds(run_dir: Path) -> list[int]:
    return sorted(int(path.stem.removeprefix("round-")) for path in (run_dir / "refresh_cache").glob("round-*.npz"))


# What only training decides (who trained, on which host, how much, what it sent, when on
# the virtual clock, how long it took): a replay trains and sends nothing, so these are absent there.
_TRAFFIC_COLUMNS = {"bytes_up", "bytes_down", "eval_bytes_down"}
_TRAINING_CLIENT_COLUMNS = {"host", "participated", "train_loss", "num_samples", *_TRAFFIC_COLUMNS}
_TRAINING_ROUND_COLUMNS = {
    "num_participants", "num_rejected", "num_dropped", "samples_trained", "local_steps", "eval_samples_trained",
    "eval_local_steps", "mean_train_loss", "virtual_time", "wall_time_s", "aggregate_s", "elapsed_s", *_TRAFFIC_COLUMNS,
}


def test_replay_with_the_runs_own_settings_reproduces_its_logged_accuracies(finished_run, tmp_path):
    out_dir = ablate_run(finished_run, [], tmp_path / "same")
    logged = _by_round_and_client(finished_run)
    replayed = _by_round_and_client(out_dir)
    refresh_rounds = _refresh_rounds(finished_run)
    assert refresh_rounds == [2, 3]
    # the first refresh scores some clients that never trained (initial head, global encoder only)
    assert any(row["accuracy_personalized"] is None for (r, _), row in replayed.items() if r == 2)
    assert sorted(replayed) == sorted(key for key in logged if key[0] in refresh_rounds)
    for key, row in replayed.items():
        for column, value in row.items():
            if column in _TRAINING_CLIENT_COLUMNS:
                assert value is None or value is False, (key, column)
            else:  # every score, reference, group and membership, bit for bit
                assert value == logged[key][column], (key, column)
    # the refresh table and the rounds table's evaluation columns, bit for bit
    assert read_table(out_dir, "refresh").to_pylist() == read_table(finished_run, "refresh").to_pylist()
    logged_rounds = {row["round"]: row for row in read_table(finished_run, "rounds").to_pylist()}
    for row in read_table(out_dir, "rounds").to_pylist():
        for column, value in row.items():
            if column not in _TRAINING_ROUND_COLUMNS:
                assert value == logged_rounds[row["round"]][column], (row["round"], column)

    manifest = json.loads((out_dir / "manifest.json").read_text())
    assert manifest["status"] == "completed"
    assert manifest["ablation_of"] == str(finished_run) and manifest["overrides"] == []
    rounds = read_table(out_dir, "rounds").to_pylist()
    assert [row["round"] for row in rounds] == [2, 3]
    assert all(row["evaluated"] and row["personalized"] for row in rounds)
    assert load_run(out_dir).final_evaluated_round()["round"] == 3


def test_mix_zero_scores_every_client_with_the_global_encoder(finished_run, tmp_path):
    out_dir = ablate_run(finished_run, ["algorithm.hdcfl.mix=0"], tmp_path / "mix0")
    rows = read_table(out_dir, "clients").to_pylist()
    assert rows
    for row in rows:
        if row["accuracy_personalized"] is not None:
            assert row["accuracy_personalized"] == row["accuracy_global"]
        assert row["accuracy"] == row["accuracy_global"]
    assert "mix: 0" in (out_dir / "scenario.yaml").read_text()


def test_one_group_puts_every_cached_client_in_group_zero(finished_run, tmp_path):
    out_dir = ablate_run(finished_run, ["algorithm.hdcfl.groups=1"], tmp_path / "one-group")
    groups = [row["group"] for row in read_table(out_dir, "clients").to_pylist() if row["group"] is not None]
    assert groups and set(groups) == {0}
    assert {row["num_groups"] for row in read_table(out_dir, "rounds").to_pylist()} == {1}


def test_overriding_a_key_outside_hdcfl_is_refused_naming_it(finished_run, tmp_path):
    with pytest.raises(ScenarioError, match="protocol.rounds"):
        ablate_run(finished_run, ["protocol.rounds=5"], tmp_path / "bad")
    with pytest.raises(ScenarioError, match="refresh schedule"):
        ablate_run(finished_run, ["algorithm.hdcfl.refresh_every=2"], tmp_path / "bad")


def test_a_run_without_refresh_caches_is_refused_with_the_fix(finished_run, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(finished_run, bare, ignore=shutil.ignore_patterns("refresh_cache"))
    with pytest.raises(ScenarioError, match="save_refresh_cache"):
        ablate_run(bare, [], tmp_path / "out")


def test_an_out_dir_that_holds_files_is_refused(finished_run, tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("keep me")
    with pytest.raises(ScenarioError, match="already holds files"):
        ablate_run(finished_run, [], taken)


def test_the_variant_table_carries_table_10s_silhouette_and_refresh_ari(finished_run, tmp_path):
    """`hdcfl-ray report` over a run and its replays: one row per variant, with the
    mean over refreshes of the logged silhouette and consecutive-refresh ARI (table 10)."""
    import math

    from analysis.final_metrics import run_metrics
    from analysis.report_tables import variant_tables

    raw = ablate_run(finished_run, ["algorithm.hdcfl.descriptor=raw"], tmp_path / "raw")
    runs = [load_run(finished_run), load_run(raw)]
    metrics = run_metrics(runs)
    for run, record in zip(runs, metrics):
        logged = [v for v in run.refresh.column("silhouette").to_pylist() if v is not None and not math.isnan(v)]
        assert logged and record.values["refresh_silhouette"] == pytest.approx(sum(logged) / len(logged))
    [table] = variant_tables(metrics)
    assert table.header == ["Variant", "Method", "Mean", "Worst", "Bot.20%", "Sil.", "Refresh ARI",
                            "Mean minus as run (per seed)", "Verdict vs as run"]
    assert [cell.value for cell in table.rows[0][-2:]] == ["-", "-"]
    difference = 100 * (metrics[1].values["mean_accuracy"] - metrics[0].values["mean_accuracy"])
    assert [cell.value for cell in table.rows[1][-2:]] == [f"{difference:+.2f}", "one seed"]
    variants = [row[0].value for row in table.rows]
    assert len(variants) == 2 and variants[0] == "as run" and "raw" in variants[1], variants
    silhouette = table.header.index("Sil.")
    for row, record in zip(table.rows, metrics):
        assert row[silhouette].value == f"{record.values['refresh_silhouette']:.2f}"  # one seed: no std
