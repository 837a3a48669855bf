"""FedBABU: one frozen head h_0 for everybody, a sample-weighted body, and a full-model
fine-tuning on training data at the final evaluation only (spec §2)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hdcfl_ray.maths.aggregate import weighted_average
from hdcfl_ray.algorithms.fedbabu import FedBABU, FedBABUParams, finetune_optimizer
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.config.methods import run_info
from hdcfl_ray.runtime.backends.local_host import in_process_run
from hdcfl_ray.runtime.driver import prepare_run
from tests.conftest import tiny_scenario

FAST_PROTOCOL = {"rounds": 2, "participation": 0.5, "local_epochs": 2, "batch_size": 16}


class RecordingFedBABU(FedBABU):
    """FedBABU that remembers what it saw: the head after every local training, the
    uploads the server averaged, the head after every evaluation and the data the
    final fine-tuning was given."""

    def __init__(self, params: FedBABUParams, scenario: Any) -> None:
        super().__init__(params, run_info(scenario))
        self.trained_heads: list[tuple[int, int, np.ndarray]] = []
        self.aggregated: list[tuple[int, list[np.ndarray], list[int]]] = []
        self.uploaded_names: set[tuple[str, ...]] = set()
        self.evaluated_heads: dict[tuple[int, bool], np.ndarray] = {}
        self.finetune_calls: list[tuple[int, dict[str, Any]]] = []

    def local_update(self, ctx, state, task, objects):
        upload, new_state = super().local_update(ctx, state, task, objects)
        self.trained_heads.append((ctx.round_index, ctx.client_id, ctx.snapshot().head))
        return upload, new_state

    def aggregate(self, state, round_index, uploads):
        ordered = sorted(uploads, key=lambda upload: upload.client_id)
        self.aggregated.append((round_index, [u.models["encoder"] for u in ordered], [u.num_samples for u in ordered]))
        self.uploaded_names |= {tuple(sorted(u.models)) for u in ordered} | {tuple(sorted(u.values)) for u in ordered}
        return super().aggregate(state, round_index, uploads)

    def evaluate(self, ctx, state, task, objects, final):
        real_train = ctx.train

        def spy(**kwargs):
            self.finetune_calls.append((ctx.client_id, kwargs))
            return real_train(**kwargs)

        ctx.train = spy
        result = super().evaluate(ctx, state, task, objects, final)
        self.evaluated_heads[(ctx.client_id, final)] = ctx.snapshot().head
        return result


def babu_run(protocol: dict[str, Any] | None = None, **params: Any):
    scenario = build_scenario(
        tiny_scenario(algorithm={"name": "fedbabu", "fedbabu": params}, protocol={**FAST_PROTOCOL, **(protocol or {})})
    )
    algorithm = RecordingFedBABU(scenario.algorithm.fedbabu, scenario)
    return in_process_run(prepare_run(scenario), algorithm=algorithm), algorithm


def test_head_stays_h0_and_identical_on_every_client_through_training():
    run, algorithm = babu_run()
    initial_head = np.array(run.server.state.head, copy=True)
    initial_encoder = np.array(run.server.state.global_encoder, copy=True)
    run.run_all()
    assert len({client for _, client, _ in algorithm.trained_heads}) > 1
    for _, _, head in algorithm.trained_heads:
        assert np.array_equal(head, initial_head)
    assert np.array_equal(run.server.state.head, initial_head)
    # the body did train, under that head
    assert not np.array_equal(run.server.state.global_encoder, initial_encoder)
    # nothing private on the clients, so no per-client head copies
    assert all(state is None for state in run.host.client_states.values())


def test_uploads_carry_the_encoder_only_and_the_global_encoder_is_their_weighted_average():
    run, algorithm = babu_run()
    run.run_round(1)
    round_index, encoders, counts = algorithm.aggregated[-1]
    assert round_index == 1 and len(encoders) == 4  # participation 0.5 of 8 clients
    expected = weighted_average(encoders, counts)
    assert np.array_equal(run.server.state.global_encoder, expected)
    assert encoders[0].shape == run.server.state.global_encoder.shape
    assert algorithm.uploaded_names == {("encoder",), ()}


def test_intermediate_evaluations_score_global_encoder_with_h0_and_never_finetune():
    run, algorithm = babu_run(protocol={"rounds": 3})
    report = run.run_round(1)
    assert algorithm.finetune_calls == []
    for evaluation in report.eval_reports:
        assert set(evaluation.result.references) == {"global"}
        assert evaluation.result.headline == "global"
    assert len(report.eval_reports) == 8  # every client, participants or not


def test_final_evaluation_logs_personalized_beside_global_and_finetuning_moves_the_head():
    run, algorithm = babu_run(finetune_epochs=5, finetune_lr=0.05)
    initial_head = np.array(run.server.state.head, copy=True)
    reports = run.run_all()
    final = reports[-1].eval_reports
    assert len(final) == 8
    for evaluation in final:
        assert set(evaluation.result.references) == {"global", "personalized"}
        assert evaluation.result.headline == "personalized"
    for client_id in range(8):
        assert not np.array_equal(algorithm.evaluated_heads[(client_id, True)], initial_head)
    # fine-tuning is scoring-only: the shared head on the server is still h_0
    assert np.array_equal(run.server.state.head, initial_head)
    mean_before = np.mean([e.result.references["global"].accuracy for e in final])
    mean_after = np.mean([e.result.references["personalized"].accuracy for e in final])
    assert mean_after > mean_before


def test_finetuning_uses_the_training_split_and_the_finetune_optimizer():
    run, algorithm = babu_run(finetune_epochs=1)
    run.run_all()
    assert [client for client, _ in algorithm.finetune_calls] == list(range(8))
    for client_id, kwargs in algorithm.finetune_calls:
        train_inputs, train_labels = run.host.context(client_id, 2).train_data()
        inputs, labels = kwargs["data"]
        assert torch.equal(inputs, train_inputs) and torch.equal(labels, train_labels)
        assert kwargs["epochs"] == 1
        assert kwargs["optimizer"] == finetune_optimizer(algorithm.params)
        assert kwargs.get("train_head", True) and kwargs.get("train_encoder", True)
    config = finetune_optimizer(FedBABUParams())
    assert (config.name, config.lr, config.momentum, config.weight_decay) == ("sgd", 1.0e-2, 0.0, 0.0)


def test_zero_finetune_epochs_scores_personalized_exactly_like_global():
    run, _ = babu_run(finetune_epochs=0)
    for evaluation in run.run_all()[-1].eval_reports:
        references = evaluation.result.references
        assert references["personalized"] == references["global"]


def test_same_scenario_twice_gives_identical_results():
    outcomes = []
    for _ in range(2):
        run, _ = babu_run()
        reports = run.run_all()
        outcomes.append(
            (
                run.server.state.global_encoder,
                [(e.client_id, dict(e.result.references)) for r in reports for e in r.eval_reports],
            )
        )
    assert np.array_equal(outcomes[0][0], outcomes[1][0])
    assert outcomes[0][1] == outcomes[1][1]
