"""Donor-swap diagnostic as a spec: planted groups are found, random similarity
scores at chance, standard errors are the textbook ones, and a real run's cache
yields one row per ordered client pair."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.diagnostics.donor_swap import (
    analyse_run,
    auroc_ap,
    beneficial,
    beneficial_rate,
    quintile_gains,
    spearman_per_target,
    standard_error,
    summarise,
    top1_minus_random,
)
from hdcfl_ray.ablation.donor_swap_run import donor_swap, format_summary
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.terminal.live_view import QuietObserver
from tests.conftest import tiny_scenario


def planted(num_clients: int = 20, num_groups: int = 4, seed: int = 0):
    """Same-group donors help (loss down, accuracy up) and look alike; others hurt."""
    rng = np.random.default_rng(seed)
    groups = np.arange(num_clients) % num_groups
    same = groups[:, None] == groups[None, :]
    similarity = np.where(same, 0.8, 0.1) + 0.05 * rng.standard_normal((num_clients, num_clients))
    loss_delta = np.where(same, -0.3, 0.5) + 0.05 * rng.standard_normal((num_clients, num_clients))
    acc_delta = np.where(same, 0.05, -0.10) + 0.01 * rng.standard_normal((num_clients, num_clients))
    np.fill_diagonal(similarity, 1.0)
    np.fill_diagonal(loss_delta, 0.0)
    np.fill_diagonal(acc_delta, 0.0)
    return similarity, loss_delta, acc_delta


def test_beneficial_excludes_the_diagonal():
    loss_delta = -np.ones((3, 3))
    assert not beneficial(loss_delta).diagonal().any()
    assert beneficial_rate(loss_delta) == 1.0


def test_planted_groups_give_high_auroc_positive_rho_and_lift():
    similarity, loss_delta, acc_delta = planted()
    auroc, ap = auroc_ap(similarity, beneficial(loss_delta))
    assert auroc > 0.95
    assert ap - beneficial_rate(loss_delta) > 0
    assert (spearman_per_target(similarity, loss_delta) > 0).all()
    assert (top1_minus_random(similarity, acc_delta) > 0).all()
    quintiles = quintile_gains(1.0 - similarity, acc_delta)
    assert quintiles.shape == (20, 5)
    assert quintiles[:, 0].mean() > quintiles[:, 4].mean()

    summary = summarise([analyse_run(loss_delta, acc_delta, similarity, similarity)])
    assert summary.auroc > 0.95 and summary.ap_lift > 0 and summary.spearman_rho > 0
    assert summary.quintile_gain_pp[0] > summary.quintile_gain_pp[4]
    assert summary.num_units == 20
    assert "AP lift" in format_summary(summary)


def test_random_similarity_scores_at_chance():
    rng = np.random.default_rng(1)
    size = 150
    similarity, loss_delta = rng.random((size, size)), rng.standard_normal((size, size))
    auroc, _ = auroc_ap(similarity, beneficial(loss_delta))
    assert abs(auroc - 0.5) < 0.15


def test_one_class_gives_nan_auroc_and_constant_row_nan_rho():
    similarity = np.random.default_rng(2).random((4, 4))
    assert all(math.isnan(v) for v in auroc_ap(similarity, beneficial(np.ones((4, 4)))))
    rho = spearman_per_target(similarity, np.ones((4, 4)))
    assert np.isnan(rho).all()


def test_top1_minus_random_in_percentage_points():
    similarity = np.array([[1.0, 0.9, 0.1], [0.9, 1.0, 0.1], [0.1, 0.2, 1.0]])
    acc_delta = np.array([[0.0, 0.06, 0.0], [0.02, 0.0, 0.04], [0.01, 0.03, 0.0]])
    # target 0: best donor 1 gains 6 pp, mean 3 pp; target 1: donor 0 gains 2, mean 3;
    # target 2: donor 1 gains 3, mean 2
    np.testing.assert_allclose(top1_minus_random(similarity, acc_delta), [3.0, -1.0, 1.0])


def test_quintiles_split_donors_closest_first():
    size = 11  # ten donors per target: two per quintile
    distance = np.tile(np.arange(size, dtype=float), (size, 1))
    acc_delta = np.tile(np.arange(size, dtype=float) / 100.0, (size, 1))
    gains = quintile_gains(distance, acc_delta)
    # target 0 has donors 1..10: bins (1,2), (3,4), ... in pp
    np.testing.assert_allclose(gains[0], [1.5, 3.5, 5.5, 7.5, 9.5])


def test_standard_error_is_sample_std_over_root_n():
    values = np.array([1.0, 2.0, 4.0, np.nan])
    # mean 7/3, sum of squares of deviations 14/3, sample variance 7/3
    assert standard_error(values) == pytest.approx(math.sqrt(7 / 3) / math.sqrt(3))
    assert math.isnan(standard_error(np.array([5.0])))


def test_summary_se_is_over_target_seed_units():
    similarity, loss_delta, acc_delta = planted(num_clients=10, num_groups=2)
    runs = [analyse_run(loss_delta, acc_delta, similarity, similarity)] * 2
    summary = summarise(runs)
    stacked = np.concatenate([run.quintile_gain_pp for run in runs])
    assert summary.num_units == 20
    np.testing.assert_allclose(summary.quintile_se_pp, stacked.std(axis=0, ddof=1) / math.sqrt(20))


def test_missing_refresh_cache_says_to_rerun_with_the_flag(tmp_path):
    (tmp_path / "scenario.yaml").write_text("name: x\n")
    with pytest.raises(ScenarioError, match="save_refresh_cache=true"):
        donor_swap(tmp_path)


@pytest.mark.slow  # a long end-to-end run: the slow tier (.ci/run runs it after the README's command)
@pytest.mark.usefixtures("ray_session")
def test_donor_swap_on_a_tiny_run_writes_one_row_per_ordered_pair(tmp_path: Path):
    # two rounds: the activation round 2 is the one refresh, so its cache is the last
    scenario = build_scenario(
        tiny_scenario(output={"save_refresh_cache": True}, protocol={"rounds": 2}, partition={"num_clients": 6})
    )
    run_dir = tmp_path / "run"
    run_simulation(prepare_run(scenario), run_dir, QuietObserver())

    summary = donor_swap(run_dir, out_dir=tmp_path / "out", max_test_samples=16)
    table = pq.read_table(tmp_path / "out" / "donor_swap.parquet").to_pydict()
    num_clients = scenario.partition.num_clients
    assert len(table["target"]) == num_clients * (num_clients - 1)
    assert all(t != d for t, d in zip(table["target"], table["donor"]))
    assert all(np.isfinite(table["loss_delta"])) and all(np.isfinite(table["acc_delta"]))
    assert all(-1.0 - 1e-9 <= s <= 1.0 + 1e-9 for s in table["similarity_lowrank"])
    assert table["beneficial"] == [d < 0 for d in table["loss_delta"]]
    assert 0.0 <= summary.beneficial_rate <= 1.0
    assert math.isfinite(summary.top1_minus_random_pp)
    for value in (summary.spearman_rho, summary.auroc, summary.ap, summary.ap_lift, summary.spearman_rho_raw, summary.auroc_raw):
        assert math.isnan(value) or math.isfinite(value)
    assert summary.quintile_gain_pp.shape == (5,) and summary.quintile_se_pp.shape == (5,)
    assert "Q1 (closest)" in format_summary(summary)

    # targets scored in parallel on Ray give exactly the in-process matrices
    from hdcfl_ray.ablation.donor_swap_run import swap_matrices, swap_matrices_on_ray
    from hdcfl_ray.logs.refresh_cache import read_refresh_caches
    from hdcfl_ray.runtime.backends.local_host import local_host

    cache = read_refresh_caches(run_dir, purpose="test")[-1]
    prepared = prepare_run(scenario)
    serial = swap_matrices(local_host(prepared), cache.client_ids, cache.heads, cache.encoders, cache.round_index, 16)
    parallel = swap_matrices_on_ray(prepared, cache.client_ids, cache.heads, cache.encoders, cache.round_index, 16, workers=2)
    assert np.array_equal(serial[0], parallel[0]) and np.array_equal(serial[1], parallel[1])

    # the command over several runs (here the same run twice, as two seeds would be): every
    # target of every run is a unit, and --report keeps the tables with the runs and what made them
    from typer.testing import CliRunner

    from cli import app

    twice = tmp_path / "twice"
    result = CliRunner().invoke(app, ["diagnose", "donor-swap", str(run_dir), str(run_dir), "--max-test-samples", "16",
                                      "--out", str(twice), "--report", str(tmp_path / "donors.md")])
    assert result.exit_code == 0, result.output
    assert f"Donor swap ({2 * summary.num_units} target units)" in result.output
    assert sorted(path.name for path in twice.iterdir()) == ["1-run", "2-run"]
    written = (tmp_path / "donors.md").read_text()
    assert "| Q1 (closest) |" in written and f"Runs: `{run_dir}`, `{run_dir}`; 16 test images per target." in written
    assert "Made from 2 runs: commit" in written
