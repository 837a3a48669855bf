"""Ditto: FedAvg's global model plus a persistent personal model per client, pulled
towards the global model it downloaded. The global model is FedAvg's bit for bit; a huge
lambda ends the personal model next to that round's global model; lambda = 0 is plain
local training; every training counts in the budget; the personal model is scored.

lambda is chosen per client by default: a seeded, stratified validation share of the
client's training data, the same every round and disjoint from the share the personal
models train on; one personal model per candidate; the one with the best validation
accuracy is scored, and the choices are logged. `fixed` is the single-lambda Ditto."""

from __future__ import annotations

from pathlib import Path

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from hdcfl_ray.algorithms.ditto import Ditto, DittoClient, DittoParams, choose_candidate, validation_split
from hdcfl_ray.algorithms.proximal import proximal_regulariser
from hdcfl_ray.checkpoint.codec import Decoder, Encoder
from hdcfl_ray.contract import EvalStats, ModelParams
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.runtime.backends.local_host import in_process_run
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.terminal.live_view import QuietObserver
from tests.conftest import tiny_scenario


class RecordingDitto(Ditto):
    """Ditto that keeps the global model each round broadcast for training (what its clients
    downloaded; the round's evaluation broadcasts the aggregated model again, not kept)."""

    def broadcast(self, state, round_index):
        self.downloaded = getattr(self, "downloaded", {})
        self.downloaded.setdefault(round_index, state.model)
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


@pytest.mark.parametrize("selection", ["per_client", "fixed"])
def test_the_global_model_is_fedavgs_bit_for_bit(selection):
    protocol = {"rounds": 2, "participation": 0.5}
    ditto, avg = ditto_run(protocol, personal_epochs=2, lambda_selection=selection), fedavg_run(protocol)
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
        run = ditto_run({"rounds": 2}, proximal=strength, personal_epochs=5, lambda_selection="fixed")
        run.run_all()
        downloaded = run.algorithm.downloaded[2]  # round 2's global model, away from where v_k started
        gaps[strength] = [distance(run.host.client_states[k].model, downloaded) for k in range(8)]
        scale = float(np.linalg.norm(flat(downloaded)))
    assert all(pulled < 0.1 * free for pulled, free in zip(gaps[20.0], gaps[0.0]))
    assert all(pulled < 0.01 * scale for pulled in gaps[20.0])


def same(first, second) -> bool:
    return np.array_equal(first.encoder, second.encoder) and np.array_equal(first.head, second.head)


def replay_personal(run, client_id, strength, share=lambda ctx: None):
    """Each round the global model trains first (drawing its batch order), then v_k alone:
    on `share(ctx)` (None = the whole training data) with the proximal pull `strength`."""
    personal = run.host.initial_states[client_id].model
    for round_index in sorted(run.algorithm.downloaded):
        ctx = run.host.context(client_id, round_index)
        downloaded = run.algorithm.downloaded[round_index]
        ctx.load(downloaded)
        ctx.train()
        regulariser = proximal_regulariser(ctx, [downloaded], np.ones(1), strength) if strength > 0 else None
        ctx.load(personal)
        ctx.train(data=share(ctx), regulariser=regulariser)
        personal = ctx.snapshot()
    return personal


def test_lambda_zero_is_plain_local_training_of_the_personal_model():
    run = ditto_run({"rounds": 2}, proximal=0.0, lambda_selection="fixed")
    run.run_all()
    for client_id in range(8):
        kept = run.host.client_states[client_id].model
        assert same(kept, replay_personal(run, client_id, 0.0))
        assert distance(kept, run.server.state.model) > 0  # its own model, not the global one


def test_fixed_lambda_is_the_single_lambda_ditto_on_the_whole_training_data():
    # the Ditto this project ran before lambda was chosen per client, written out
    run = ditto_run({"rounds": 2}, proximal=0.3, lambda_selection="fixed")
    reports = run.run_all()
    for client_id in range(8):
        state = run.host.client_states[client_id]
        assert same(state.model, replay_personal(run, client_id, 0.3))
        assert state.candidates == () and state.chosen is None
    assert all(set(upload.values) == {"personal_loss"} for report in reports for upload in report.uploads)
    assert not any("lambda chosen" in event for report in reports for event in report.events)


def test_both_trainings_count_in_the_budget():
    run = ditto_run({"rounds": 1, "local_epochs": 1}, personal_epochs=2, lambda_selection="fixed")
    report = run.run_round(1)
    for upload in report.uploads:
        assert upload.budget.samples == 3 * upload.num_samples  # 1 global epoch + 2 personal epochs
        assert upload.budget.steps == 3 * upload.steps


def test_every_candidates_training_counts_in_the_budget():
    run = ditto_run({"rounds": 1, "local_epochs": 1}, personal_epochs=2, lambda_candidates=[0.0, 0.1, 1.0])
    report = run.run_round(1)
    for upload in report.uploads:
        training, _ = run.algorithm.split(run.host.context(upload.client_id, 1))
        share = int(training[1].shape[0])
        # 1 global epoch on all the training data + 3 candidates x 2 personal epochs on the training share
        assert upload.budget.samples == upload.num_samples + 3 * 2 * share


# ---- per-client lambda: the validation share ----


def test_the_validation_split_is_disjoint_complete_and_stratified():
    labels = np.array([0] * 10 + [1] * 5 + [2] * 1 + [3] * 2)
    training, validation = validation_split(labels, 0.2, np.random.default_rng(0))
    assert not set(training) & set(validation)
    assert sorted([*training, *validation]) == list(range(labels.size))
    held = {label: int((labels[validation] == label).sum()) for label in range(4)}
    assert held == {0: 2, 1: 1, 2: 0, 3: 0}  # round(0.2 x count) per class
    assert set(labels[training]) == {0, 1, 2, 3}  # every class keeps training samples


def test_a_client_too_small_for_any_class_to_give_one_still_holds_one_sample_out():
    training, validation = validation_split(np.array([0, 1, 2]), 0.2, np.random.default_rng(0))
    assert validation.size == 1 and training.size == 2
    training, validation = validation_split(np.array([4]), 0.2, np.random.default_rng(0))
    assert validation.size == 0 and list(training) == [0]


def test_the_validation_share_is_fixed_by_seed_and_client_not_by_round():
    run = ditto_run({"rounds": 1})
    algorithm = run.algorithm

    def indices(client_id, round_index):
        ctx = run.host.context(client_id, round_index)
        labels = ctx.train_data()[1].cpu().numpy()
        (train_x, train_y), (val_x, val_y) = algorithm.split(ctx)
        assert int(train_y.shape[0]) + int(val_y.shape[0]) == labels.size
        return train_x.cpu().numpy(), val_x.cpu().numpy()

    for client_id in range(8):
        first, later = indices(client_id, 1), indices(client_id, 5)
        assert np.array_equal(first[0], later[0]) and np.array_equal(first[1], later[1])
        inputs = run.host.context(client_id, 1).train_data()[0].cpu().numpy()
        rows = {row.tobytes(): i for i, row in enumerate(inputs)}
        train_rows = {row.tobytes() for row in first[0]}
        val_rows = {row.tobytes() for row in first[1]}
        assert val_rows and not train_rows & val_rows  # no image in both shares
        assert len(train_rows | val_rows) == len(rows)
    assert not np.array_equal(indices(0, 1)[1], indices(1, 1)[1])  # another client, another share


# ---- per-client lambda: choosing ----


def stats(accuracy, loss):
    return EvalStats(accuracy=accuracy, loss=loss, num_samples=10)


def test_the_candidate_with_the_best_validation_accuracy_is_chosen():
    lambdas = [0.01, 0.1, 1.0, 2.0]
    assert choose_candidate(lambdas, [stats(0.5, 0.1), stats(0.9, 2.0), stats(0.7, 0.5), stats(0.6, 0.2)]) == 1


def test_ties_in_accuracy_go_to_the_lower_validation_loss_then_to_the_smaller_lambda():
    assert choose_candidate([0.01, 0.1, 1.0], [stats(0.8, 0.6), stats(0.8, 0.4), stats(0.5, 0.1)]) == 1
    # the grid's order does not matter: the smaller lambda wins a full tie
    assert choose_candidate([2.0, 1.0, 0.1], [stats(0.8, 0.4), stats(0.8, 0.4), stats(0.8, 0.4)]) == 2


def test_a_nan_validation_score_ranks_last():
    nan = float("nan")
    assert choose_candidate([0.1, 1.0], [stats(nan, nan), stats(0.1, 3.0)]) == 1
    assert choose_candidate([1.0, 0.1], [stats(nan, nan), stats(nan, nan)]) == 1  # no validation data: smallest lambda


def test_one_candidate_is_the_fixed_lambda_ditto_trained_on_the_training_share():
    run = ditto_run({"rounds": 2}, lambda_candidates=[0.3])
    run.run_all()
    for client_id in range(8):
        state = run.host.client_states[client_id]
        expected = replay_personal(run, client_id, 0.3, share=lambda ctx: run.algorithm.split(ctx)[0])
        assert same(state.model, expected) and len(state.candidates) == 1 and same(state.candidates[0], expected)
        assert state.chosen == 0.3


def test_each_client_is_scored_with_its_best_candidate_on_validation_and_the_choices_are_logged():
    lambdas = [0.0, 0.1, 1.0]
    run = ditto_run({"rounds": 2}, lambda_candidates=lambdas)
    reports = run.run_all()
    chosen = {}
    for client_id in range(8):
        state = run.host.client_states[client_id]
        ctx = run.host.context(client_id, 2)
        _, validation = run.algorithm.split(ctx)
        scores = [ctx.score(candidate, data=validation) for candidate in state.candidates]
        best = choose_candidate(lambdas, scores)
        assert state.chosen == lambdas[best] and same(state.model, state.candidates[best])
        chosen[client_id] = state.chosen
    for evaluation in reports[-1].eval_reports:  # the chosen candidate is the scored one
        ctx = run.host.context(evaluation.client_id, 2)
        assert evaluation.result.references["personalized"] == ctx.score(run.host.client_states[evaluation.client_id].model)
    assert {u.client_id: u.values["lambda"] for u in reports[-1].uploads} == chosen
    [event] = [e for e in reports[-1].events if e.startswith("ditto: lambda chosen on local validation")]
    assert all(f"{client_id}: {value:g}" in event for client_id, value in chosen.items())


def test_the_candidates_persist_across_rounds():
    run = ditto_run({"rounds": 1}, lambda_candidates=[0.1, 1.0])
    run.run_round(1)
    after_one = run.host.client_states[0].candidates
    run.run_round(2)
    # round 2 continues each candidate from its own round-1 model: replay candidate 1.0 alone
    ctx = run.host.context(0, 2)
    downloaded = run.algorithm.downloaded[2]
    ctx.load(downloaded)
    ctx.train()
    training, _ = run.algorithm.split(ctx)
    ctx.load(after_one[0])
    ctx.train(data=training, regulariser=proximal_regulariser(ctx, [downloaded], np.ones(1), 0.1))
    ctx.load(after_one[1])
    ctx.train(data=training, regulariser=proximal_regulariser(ctx, [downloaded], np.ones(1), 1.0))
    assert same(run.host.client_states[0].candidates[1], ctx.snapshot())


def test_the_candidate_grid_must_be_distinct_and_not_negative():
    for bad in ([], [0.1, 0.1], [-0.1, 1.0]):
        with pytest.raises(ValidationError):
            DittoParams(lambda_candidates=bad)
    with pytest.raises(ValidationError):
        DittoParams(validation_fraction=0.5)  # a class of one sample would lose its only training sample


# ---- checkpoints ----


def round_trip(value):
    encoder = Encoder()
    document = json.loads(json.dumps(encoder.encode(value)))
    return Decoder(dict(encoder.arrays)).decode(document)


def test_a_client_state_with_candidates_survives_a_checkpoint():
    run = ditto_run({"rounds": 1}, lambda_candidates=[0.1, 1.0])
    run.run_round(1)
    state = run.host.client_states[3]
    restored = round_trip(state)
    assert isinstance(restored, DittoClient) and restored.chosen == state.chosen
    assert same(restored.model, state.model)
    assert len(restored.candidates) == 2 and all(same(a, b) for a, b in zip(restored.candidates, state.candidates))


def test_a_per_client_run_stopped_and_resumed_gives_the_uninterrupted_scores(tmp_path: Path):
    class StopAfterRound(QuietObserver):
        def on_round(self, round_row, refresh_row, events):
            if round_row["round"] == 3:
                raise KeyboardInterrupt("stopped by the test")

    scenario = build_scenario(
        tiny_scenario(
            algorithm={"name": "ditto", "ditto": {"lambda_candidates": [0.1, 1.0]}},
            protocol={"rounds": 4, "participation": 0.5},
            checkpoint={"every": 2},
            runtime={"backend": "local"},
        )
    )
    run_simulation(prepare_run(scenario), tmp_path / "reference", QuietObserver())
    with pytest.raises(KeyboardInterrupt):
        run_simulation(prepare_run(scenario), tmp_path / "stopped", StopAfterRound())  # checkpoint at 2
    run_simulation(prepare_run(scenario), tmp_path / "stopped", QuietObserver(), resume=True)
    for table, columns in (("clients", ("round", "client_id", "accuracy", "loss")), ("events", ("round", "message"))):
        reference = pq.read_table(tmp_path / "reference" / f"{table}.parquet").select(list(columns)).to_pylist()
        resumed = pq.read_table(tmp_path / "stopped" / f"{table}.parquet").select(list(columns)).to_pylist()
        assert sorted(resumed, key=str) == sorted(reference, key=str), table


def test_a_checkpointed_state_from_before_per_client_selection_still_loads():
    model = ModelParams(np.arange(4, dtype=np.float32), np.ones(2, np.float32))
    encoder = Encoder()
    document = {"__dataclass__": "hdcfl_ray.algorithms.ditto:DittoClient", "fields": {"model": encoder.encode(model)}}
    restored = Decoder(dict(encoder.arrays)).decode(document)
    assert same(restored.model, model) and restored.candidates == () and restored.chosen is None


def test_evaluation_scores_the_personal_model_and_logs_the_global_one():
    run = ditto_run({"rounds": 1})
    for host in run.hosts:  # scored one client at a time, as ctx.score does below (the batched path: test_batched_scoring.py)
        host.batched_evaluation = False
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
    assert set(clients["group"]) == {None}  # the chosen lambda is no cluster: it is in the events
    events = pq.read_table(tmp_path / "ditto" / "events.parquet").to_pydict()
    chosen = [(r, m) for r, m in zip(events["round"], events["message"]) if m.startswith("ditto: lambda chosen")]
    assert [r for r, _ in chosen] == [1, 2]
