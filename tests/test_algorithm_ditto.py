"""Ditto: FedAvg's global model plus a persistent personal model per client, pulled
towards the global model it downloaded. The global model is FedAvg's bit for bit; a huge
lambda ends the personal model next to that round's global model; lambda = 0 is plain
local training; both trainings count in the budget; the personal model is scored."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from hdcfl_ray.algorithms.ditto import Ditto
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.runtime.backends.local_host import in_process_run
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.terminal.live_view import QuietObserver
from tests.conftest import tiny_scenario


class RecordingDitto(Ditto):
    """Ditto that keeps the global model each round broadcast (what its clients downloaded)."""

    def broadcast(self, state, round_index):
        self.downloaded = getattr(self, "downloaded", {})
        self.downloaded[round_index] = state.model
        return super().broadcast(state, round_index)


def ditto_run(protocol=None, **params):
    scenario = build_scenario(tiny_scenario(algorithm={"name": "ditto", "ditto": params}, protocol=protocol or {}))
    return in_process_run(prepare_run(scenario), algorithm=RecordingDitto(scenario.algorithm.ditto))


def fedavg_run(protocol=None):
    return in_process_run(prepare_run(build_scenario(tiny_scenario(algorithm={"name": "fedavg"}, protocol=protocol or {}))))


def flat(model) -> np.ndarray:
    return np.concatenate([model.encoder, model.head]).astype(np.float64)


def distance(first, second) -> float:
    return float(np.linalg.norm(flat(first) - flat(second)))


def test_the_global_model_is_fedavgs_bit_for_bit():
    protocol = {"rounds": 2, "participation": 0.5}
    ditto, avg = ditto_run(protocol, personal_epochs=2), fedavg_run(protocol)
    ditto_reports, avg_reports = ditto.run_all(), avg.run_all()
    assert np.array_equal(ditto.server.state.model.encoder, avg.server.state.model.encoder)
    assert np.array_equal(ditto.server.state.model.head, avg.server.state.model.head)
    for ditto_round, avg_round in zip(ditto_reports, avg_reports):
        assert ditto_round.selected == avg_round.selected
        assert [(u.client_id, u.train_loss) for u in ditto_round.uploads] == [(u.client_id, u.train_loss) for u in avg_round.uploads]
        ditto_global = [e.result.references["global"] for e in ditto_round.eval_reports]
        assert ditto_global == [e.result.references["global"] for e in avg_round.eval_reports]


def test_a_huge_lambda_ends_the_personal_model_next_to_the_global_model_of_that_round():
    # lr * lambda = 1; five personal epochs give the unregularised model room to drift
    gaps = {}
    for strength in (0.0, 20.0):
        run = ditto_run({"rounds": 2}, proximal=strength, personal_epochs=5)
        run.run_all()
        downloaded = run.algorithm.downloaded[2]  # round 2's global model, away from where v_k started
        gaps[strength] = [distance(run.host.client_states[k].model, downloaded) for k in range(8)]
        scale = float(np.linalg.norm(flat(downloaded)))
    assert all(pulled < 0.1 * free for pulled, free in zip(gaps[20.0], gaps[0.0]))
    assert all(pulled < 0.01 * scale for pulled in gaps[20.0])


def test_lambda_zero_is_plain_local_training_of_the_personal_model():
    run = ditto_run({"rounds": 2}, proximal=0.0)
    run.run_all()
    for client_id in range(8):
        # replay: each round the global model trains first (drawing its batch order), then v_k alone
        personal = run.host.initial_states[client_id].model
        for round_index in (1, 2):
            ctx = run.host.context(client_id, round_index)
            ctx.load(run.algorithm.downloaded[round_index])
            ctx.train()
            ctx.load(personal)
            ctx.train()
            personal = ctx.snapshot()
        kept = run.host.client_states[client_id].model
        assert np.array_equal(kept.encoder, personal.encoder) and np.array_equal(kept.head, personal.head)
        assert distance(kept, run.server.state.model) > 0  # its own model, not the global one


def test_both_trainings_count_in_the_budget():
    run = ditto_run({"rounds": 1, "local_epochs": 1}, personal_epochs=2)
    report = run.run_round(1)
    for upload in report.uploads:
        assert upload.budget.samples == 3 * upload.num_samples  # 1 global epoch + 2 personal epochs
        assert upload.budget.steps == 3 * upload.steps


def test_evaluation_scores_the_personal_model_and_logs_the_global_one():
    run = ditto_run({"rounds": 1})
    report = run.run_round(1)
    assert [e.client_id for e in report.eval_reports] == list(range(8))
    for evaluation in report.eval_reports:
        ctx = run.host.context(evaluation.client_id, 1)
        result = evaluation.result
        assert result.headline == "personalized"
        assert result.references["personalized"] == ctx.score(run.host.client_states[evaluation.client_id].model)
        assert result.references["global"] == ctx.score(run.server.state.model)


def test_runs_end_to_end_and_logs_personalized_beside_global(tmp_path: Path):
    scenario = build_scenario(tiny_scenario(algorithm={"name": "ditto"}, protocol={"rounds": 2}, runtime={"backend": "local"}))
    run_simulation(prepare_run(scenario), tmp_path / "ditto", QuietObserver())
    clients = pq.read_table(tmp_path / "ditto" / "clients.parquet").to_pydict()
    assert sorted(zip(clients["round"], clients["client_id"])) == [(r, k) for r in (1, 2) for k in range(8)]
    assert set(clients["reference"]) == {"personalized"}
    assert clients["accuracy"] == clients["accuracy_personalized"]
    assert all(0.0 <= a <= 1.0 for a in clients["accuracy"] + clients["accuracy_global"])
