"""FedRep: each sampled client trains its private head with the encoder frozen, then the
encoder with the head frozen, and uploads the encoder; the server averages encoders and
scores like FedAvg-SE (global encoder + own head)."""

from __future__ import annotations

from typing import Any

import numpy as np

from hdcfl_ray.maths.aggregate import weighted_average
from hdcfl_ray.algorithms.fedrep import FedRep, FedRepParams
from hdcfl_ray.algorithms.registry import method_spec
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.contract import RunInfo
from hdcfl_ray.runtime.backends.local_host import in_process_run
from hdcfl_ray.runtime.driver import prepare_run
from tests.conftest import tiny_scenario

FAST_PROTOCOL = {"rounds": 2, "participation": 0.5, "local_epochs": 2, "batch_size": 16}


class RecordingFedRep(FedRep):
    """FedRep that records, per local update, the broadcast encoder, the client's head
    before training, every `ctx.train` call (its arguments and the model before and
    after it) and the upload."""

    def __init__(self, params: FedRepParams) -> None:
        super().__init__(params, RunInfo(seed=7, rounds=2))
        self.updates: list[dict[str, Any]] = []

    def local_update(self, ctx, state, task, objects):
        record: dict[str, Any] = {"client": ctx.client_id, "broadcast": np.array(objects["global"]), "head": state.head.copy(), "phases": []}
        real_train = ctx.train

        def recording_train(**kwargs):
            before = ctx.snapshot()
            stats = real_train(**kwargs)
            record["phases"].append({"kwargs": kwargs, "before": before, "after": ctx.snapshot(), "budget": ctx.budget})
            return stats

        ctx.train = recording_train
        upload, new_state = super().local_update(ctx, state, task, objects)
        record["upload"], record["new_head"] = upload, new_state.head
        self.updates.append(record)
        return upload, new_state


def fedrep_run(protocol: dict[str, Any] | None = None, **params: Any):
    scenario = build_scenario(
        tiny_scenario(algorithm={"name": "fedrep", "fedrep": params}, protocol={**FAST_PROTOCOL, **(protocol or {})})
    )
    algorithm = RecordingFedRep(scenario.algorithm.fedrep)
    return in_process_run(prepare_run(scenario), algorithm=algorithm), algorithm


def test_head_phase_keeps_the_encoder_and_body_phase_keeps_the_head():
    run, algorithm = fedrep_run(head_epochs=3, body_epochs=1)
    run.run_round(1)
    assert len(algorithm.updates) == 4  # participation 0.5 of 8 clients
    for record in algorithm.updates:
        head_phase, body_phase = record["phases"]
        assert head_phase["kwargs"] == {"epochs": 3, "train_encoder": False}
        assert body_phase["kwargs"] == {"epochs": 1, "train_head": False}
        # head phase: starts from the broadcast encoder and the client's own head; only the head moves
        assert np.array_equal(head_phase["before"].encoder, record["broadcast"])
        assert np.array_equal(head_phase["before"].head, record["head"])
        assert np.array_equal(head_phase["after"].encoder, record["broadcast"])
        assert not np.array_equal(head_phase["after"].head, record["head"])
        # body phase: starts from the head the head phase produced; only the encoder moves
        assert np.array_equal(body_phase["before"].head, head_phase["after"].head)
        assert np.array_equal(body_phase["after"].head, head_phase["after"].head)
        assert not np.array_equal(body_phase["after"].encoder, record["broadcast"])


def test_upload_is_the_trained_encoder_and_the_client_keeps_the_head_of_the_head_phase():
    run, algorithm = fedrep_run()
    report = run.run_round(1)
    for record in algorithm.updates:
        head_phase, body_phase = record["phases"]
        upload = record["upload"]
        assert np.array_equal(upload.models["encoder"], body_phase["after"].encoder)
        assert not np.array_equal(upload.models["encoder"], record["broadcast"])
        assert np.array_equal(record["new_head"], head_phase["after"].head)
        assert np.array_equal(run.host.client_states[record["client"]].head, head_phase["after"].head)
    uploads = sorted(algorithm.updates, key=lambda record: record["client"])
    expected = weighted_average([r["upload"].models["encoder"] for r in uploads], [r["upload"].num_samples for r in uploads])
    assert np.array_equal(run.server.state.global_encoder, expected)
    assert sorted(run.server.state.cache) == report.selected


def test_body_epochs_default_to_the_protocols_local_epochs_and_both_phases_count_in_the_budget():
    run, algorithm = fedrep_run(protocol={"local_epochs": 3}, head_epochs=2)
    report = run.run_round(1)
    for record in algorithm.updates:
        assert [phase["kwargs"]["epochs"] for phase in record["phases"]] == [2, 3]
    for meta in report.uploads:
        num_train = run.host.context(meta.client_id, 1).num_train
        assert meta.budget.samples == (2 + 3) * num_train
    assert method_spec("fedrep").params().head_epochs == 5 and method_spec("fedrep").params().body_epochs is None


def test_end_to_end_run_scores_the_global_encoder_with_the_own_head():
    run, _ = fedrep_run(protocol={"rounds": 4, "participation": 1.0})
    reports = run.run_all()
    final = reports[-1].eval_reports
    assert len(final) == 8
    for evaluation in final:
        assert evaluation.result.headline == "global"
        assert set(evaluation.result.references) == {"global", "local"}
    mean_accuracy = np.mean([e.result.references["global"].accuracy for e in final])
    assert mean_accuracy > 0.3  # ten digit classes: chance is 0.1 (this seeded run reaches 0.39)


def test_runs_in_asynchronous_mode_on_fedavg_ses_mixing():
    assert method_spec("fedrep").asynchronous
    run, algorithm = fedrep_run(
        protocol={"mode": "async", "rounds": 3, "participation": 1.0, "asynchronous": {"concurrency": 3, "aggregation": "fedasync"}}
    )
    before = run.server.state.global_encoder.copy()
    run.run_all()
    assert algorithm.updates and not np.array_equal(run.server.state.global_encoder, before)
