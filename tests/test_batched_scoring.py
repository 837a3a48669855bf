"""Evaluation batched across a host's clients (runtime/client/batched_scoring.py)
agrees with scoring one client at a time, for every method, and does not depend
on how the clients are spread over hosts.

Tolerance: the two paths differ only in the batch size the encoder's kernels see
(512-image passes against one client's test set), which may round a feature
differently in the last bits. So per client and per reference: the number of right
answers within one test image (a near-tie may flip), the loss within 1e-5
relative. On the CPUs measured the kernels do not depend on content or position
within a batch, so any host layout gives the same bits."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from hdcfl_ray.algorithms.registry import method_names
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.contract import ModelParams
from hdcfl_ray.runtime.backends.local_host import in_process_run, local_host
from hdcfl_ray.runtime.client.batched_scoring import EvaluationBatch, PendingScore
from hdcfl_ray.training.local_training import evaluate
from hdcfl_ray.runtime.driver import prepare_run
from hdcfl_ray.runtime.server.messages import EvalReport
from hdcfl_ray.models import flatten_module, load_flat_into
from tests.conftest import SMALL_FEDERATION_METHODS, slow_beyond, tiny_scenario

LOSS_RELATIVE_TOLERANCE = 1e-5


def _scenario(method: str, **sections: Any):
    algorithm = {"name": method, **{name: SMALL_FEDERATION_METHODS[name] for name in SMALL_FEDERATION_METHODS if name == method}}
    defaults = {"rounds": 2, "participation": 0.75}
    return build_scenario(tiny_scenario(algorithm=algorithm, protocol={**defaults, **sections.pop("protocol", {})}, **sections))


def _scores(reports: list[EvalReport]) -> dict[tuple[int, str], tuple[float, float, int]]:
    return {
        (report.client_id, name): (stats.accuracy, stats.loss, stats.num_samples)
        for report in reports
        for name, stats in report.result.references.items()
    }


def _evaluate(run, batched: bool, round_index: int) -> list[EvalReport]:
    for host in run.hosts:
        host.batched_evaluation = batched
    return run.server.evaluate_clients(round_index, final=True)


# methods that score some clients with a broadcast model (a global or cluster model)
SCORE_A_BROADCAST_MODEL = {"apfl", "ditto", "fedala", "fedavg", "fedavg_se", "fedbabu", "fedprox", "fedrep", "hdcfl", "ifca", "pacfl"}


@pytest.mark.parametrize("method", slow_beyond(sorted(method_names()), fast={"hdcfl", "fedavg", "ifca", "apfl", "fedsoft"}))
def test_batched_and_per_client_scores_agree_for_every_method(method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    batched_requests = []
    score_window = EvaluationBatch._score_window
    monkeypatch.setattr(EvaluationBatch, "_score_window", lambda self, window: (batched_requests.extend(window), score_window(self, window)))
    run = in_process_run(prepare_run(_scenario(method)), hosts=1)
    try:
        run.run_all()
        batched_requests.clear()
        batched, per_client = (_scores(_evaluate(run, flag, 2)) for flag in (True, False))
    finally:
        run.close()
    assert batched.keys() == per_client.keys() and batched
    if method in SCORE_A_BROADCAST_MODEL:
        assert batched_requests, "no score was batched"
    for key, (accuracy, loss, size) in batched.items():
        other_accuracy, other_loss, other_size = per_client[key]
        assert size == other_size, key
        assert abs(accuracy - other_accuracy) * size <= 1 + 1e-9, (key, accuracy, other_accuracy)
        assert loss == pytest.approx(other_loss, rel=LOSS_RELATIVE_TOLERANCE), key


@pytest.mark.parametrize("method", ["fedavg", "fedavg_se", "ifca", "hdcfl"])
def test_batched_scores_do_not_depend_on_the_host_layout(method: str) -> None:
    scores = {}
    for hosts in (1, 3):
        run = in_process_run(prepare_run(_scenario(method)), hosts=hosts)
        try:
            run.run_all()
            scores[hosts] = _scores(_evaluate(run, True, 2))
        finally:
            run.close()
    assert scores[1] == scores[3]


def _host_and_encoders():
    scenario = _scenario("fedavg")
    prepared = prepare_run(scenario)
    host = local_host(prepared)
    encoder = flatten_module(host.model.encoder)
    other = encoder + np.float32(0.01)
    head = flatten_module(host.model.head)
    return host, encoder, other, head


def _per_client_score(host, client_id: int, encoder: np.ndarray, head: np.ndarray):
    load_flat_into(host.model.encoder, encoder, host.encoder_index)
    load_flat_into(host.model.head, head, host.head_index)
    inputs, labels = host.context(client_id, 1).test_data()
    return evaluate(host.model, inputs, labels, own_classes=host.context(client_id, 1).own_classes())


def test_one_encoder_load_per_shared_encoder_and_scores_match_the_per_client_path() -> None:
    host, encoder, other, head = _host_and_encoders()
    batch = EvaluationBatch(host.model, host.encoder_index, host.head_index)
    batch.share(ModelParams(encoder))
    batch.share({"cluster": other})
    pending = {}
    for client_id in host.client_ids():
        ctx = host.context(client_id, 1, evaluation_batch=batch)
        pending[client_id] = (ctx.score(ModelParams(encoder), head=head), ctx.score(ModelParams(other), head=head))
    assert all(isinstance(score, PendingScore) for pair in pending.values() for score in pair)
    batch.flush()
    assert batch.encoder_loads == 2  # one per distinct shared encoder, whatever the client count
    with torch.no_grad():
        for client_id, (first, second) in pending.items():
            for score, vector in ((first, encoder), (second, other)):
                expected = _per_client_score(host, client_id, vector, head)
                assert score.num_samples == expected.num_samples
                assert abs(score.accuracy - expected.accuracy) * expected.num_samples <= 1 + 1e-9
                assert score.loss == pytest.approx(expected.loss, rel=LOSS_RELATIVE_TOLERANCE)
                assert score.accuracy_own_classes == pytest.approx(expected.accuracy_own_classes, abs=1.0 / expected.num_samples + 1e-9)


def test_an_encoder_no_one_shares_is_scored_at_once_exactly_as_before() -> None:
    host, encoder, _, head = _host_and_encoders()
    batch = EvaluationBatch(host.model, host.encoder_index, host.head_index)
    own = encoder * np.float32(0.5)  # a client's own encoder: not a broadcast object
    score = host.context(0, 1, evaluation_batch=batch).score(ModelParams(own), head=head)
    assert not isinstance(score, PendingScore)
    assert score == _per_client_score(host, 0, own, head)
    assert batch.encoder_loads == 0


def test_reading_a_pending_score_scores_the_batch_at_once() -> None:
    host, encoder, _, head = _host_and_encoders()
    batch = EvaluationBatch(host.model, host.encoder_index, host.head_index)
    batch.share(encoder)
    first = host.context(0, 1, evaluation_batch=batch).score(ModelParams(encoder), head=head)
    second = host.context(1, 1, evaluation_batch=batch).score(ModelParams(encoder), head=head)
    assert 0.0 <= first.accuracy <= 1.0  # a method that reads its score gets it now
    assert second.resolved() is not None and batch.encoder_loads == 1


def test_a_derived_shared_array_is_built_once_per_call() -> None:
    host, encoder, _, head = _host_and_encoders()
    batch = EvaluationBatch(host.model, host.encoder_index, host.head_index)
    built = []

    def build() -> np.ndarray:
        built.append(1)
        return encoder * np.float32(2.0)

    arrays = [host.context(k, 1, evaluation_batch=batch).shared_array(("mixture", 0), build) for k in host.client_ids()]
    assert len(built) == 1 and all(array is arrays[0] for array in arrays)
    scores = [host.context(k, 1, evaluation_batch=batch).score(ModelParams(arrays[0]), head=head) for k in host.client_ids()]
    assert all(isinstance(score, PendingScore) for score in scores)
