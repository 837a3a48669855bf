"""studies/loss_gap.py: the training and test losses it reports are the runs' own logged
ones, read at the first evaluated round at or after each share of the rounds."""

from __future__ import annotations

import math
import random
from statistics import mean

import pyarrow.parquet as pq

from studies.loss_gap import SHARES, loss_points, main


def test_the_losses_are_the_runs_own_at_each_share_of_the_rounds(tmp_path) -> None:
    from analysis.runs import load_runs
    from hdcfl_ray.config.loading import build_scenario
    from hdcfl_ray.runtime.driver import prepare_run, run_simulation
    from hdcfl_ray.terminal.live_view import QuietObserver
    from tests.conftest import tiny_scenario

    seed = random.randrange(10_000)  # any run: the study reads what the run logged
    scenario = tiny_scenario(seed=seed, algorithm={"name": "fedavg"}, protocol={"rounds": 4, "eval_every": 1},
                             runtime={"backend": "local"})  # fmt: skip
    run_simulation(prepare_run(build_scenario(scenario)), tmp_path / "sweep" / "run", QuietObserver())
    (run,) = load_runs([tmp_path / "sweep"])
    points = loss_points(run)
    assert [point.round for point in points] == [1, 2, 3, 4] and len(points) == len(SHARES), seed
    rounds = {row["round"]: row for row in pq.read_table(tmp_path / "sweep" / "run" / "rounds.parquet").to_pylist()}
    clients = pq.read_table(tmp_path / "sweep" / "run" / "clients.parquet").to_pylist()
    for point in points:
        assert point.train_loss == rounds[point.round]["mean_train_loss"] and point.accuracy == rounds[point.round]["mean_accuracy"]
        assert math.isclose(point.test_loss, mean(row["loss"] for row in clients if row["round"] == point.round)), seed
    out = tmp_path / "gap.md"
    assert main([str(tmp_path / "sweep"), "--out", str(out)]) == 0
    text = out.read_text()
    assert f"| {run.setting} | fedavg | {seed} |" in text and "Made from 1 run:" in text, text
