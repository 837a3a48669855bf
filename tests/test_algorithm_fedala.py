"""FedALA: FedAvg on the whole model plus Adaptive Local Aggregation on each client
(spec §3). The blend maths are tested as plain functions; the ALA pass on a tiny
model with BatchNorm through a real ClientContext; the hooks in an in-process run."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from hdcfl_ray.maths.aggregate import weighted_average
from hdcfl_ray.algorithms.fedala import FedALA, FedALAParams
from hdcfl_ray.algorithms.fedala_weights import (
    TRAINING_SUBSET_STREAM,
    adaptive_local_init,
    blend,
    model_slots,
    parameter_slots,
    start_phase_finished,
    top_slots,
    weight_step,
)
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.config.methods import run_info
from hdcfl_ray.config.schema import ProtocolConfig
from hdcfl_ray.contract import ModelParams
from hdcfl_ray.models import FlatIndex, SplitModel
from hdcfl_ray.runtime.backends.local_host import in_process_run
from hdcfl_ray.runtime.client.client_context import HostClientContext
from hdcfl_ray.runtime.driver import prepare_run
from tests.conftest import tiny_scenario

# ---- pure maths ----


@pytest.mark.parametrize("as_array", [np.asarray, torch.as_tensor])
def test_blend_weight_one_takes_global_and_weight_zero_keeps_local(as_array):
    local = as_array(np.array([1.0, -2.0, 3.0], np.float32))
    global_ = as_array(np.array([5.0, 0.5, -1.0], np.float32))
    ones = as_array(np.ones(3, np.float32))
    zeros = as_array(np.zeros(3, np.float32))
    assert np.array_equal(np.asarray(blend(local, global_, ones)), np.asarray(global_))
    assert np.array_equal(np.asarray(blend(local, global_, zeros)), np.asarray(local))
    halves = as_array(np.full(3, 0.5, np.float32))
    np.testing.assert_allclose(np.asarray(blend(local, global_, halves)), [3.0, -0.75, 1.0])


@pytest.mark.parametrize("as_array", [np.asarray, torch.as_tensor])
def test_weight_step_stays_in_unit_interval_even_with_huge_eta(as_array):
    rng = np.random.default_rng(0)
    weights = as_array(rng.uniform(0.0, 1.0, 50).astype(np.float32))
    gradient = as_array(rng.normal(size=50).astype(np.float32))
    local = as_array(rng.normal(size=50).astype(np.float32))
    global_ = as_array(rng.normal(size=50).astype(np.float32))
    stepped = np.asarray(weight_step(weights, gradient, global_, local, eta=1.0e9))
    assert stepped.min() >= 0.0 and stepped.max() <= 1.0
    assert set(np.unique(stepped)) <= {0.0, 1.0}  # every entry pushed to a bound


def test_weight_step_moves_against_gradient_times_model_gap():
    # W - eta * g * (theta_g - theta_i) = 0.5 - 0.1 * 2 * (3 - 1) = 0.1
    stepped = weight_step(np.array([0.5]), np.array([2.0]), np.array([3.0]), np.array([1.0]), eta=0.1)
    np.testing.assert_allclose(stepped, [0.1])


def test_start_phase_stops_at_the_epoch_cap_even_while_improving():
    improving = [10.0 - epoch for epoch in range(5)]
    assert not start_phase_finished(improving[:4], max_epochs=5, patience=3, tolerance=1e-4)
    assert start_phase_finished(improving, max_epochs=5, patience=3, tolerance=1e-4)


def test_start_phase_stops_after_patience_epochs_without_improvement():
    # best 0.8 at epoch 2; epochs 3, 4 and 5 do not beat it
    assert start_phase_finished([1.0, 0.8, 0.8, 0.8, 0.8], max_epochs=50, patience=3, tolerance=1e-4)
    assert start_phase_finished([1.0, 1.0, 1.0, 1.0], max_epochs=50, patience=3, tolerance=1e-4)
    # only two epochs without improvement so far
    assert not start_phase_finished([1.0, 0.8, 0.8, 0.8], max_epochs=50, patience=3, tolerance=1e-4)
    assert not start_phase_finished([1.0, 1.0, 1.0], max_epochs=50, patience=3, tolerance=1e-4)


def test_start_phase_counts_gains_within_tolerance_as_no_improvement():
    drifting = [1.0, 0.99997, 0.99994, 0.99992]  # never more than 1e-4 below the best 1.0
    assert start_phase_finished(drifting, max_epochs=50, patience=3, tolerance=1e-4)
    real_gain = [1.0, 0.9, 0.95, 0.96]  # 0.9 improved, and only two epochs since
    assert not start_phase_finished(real_gain, max_epochs=50, patience=3, tolerance=1e-4)
    # an improving epoch resets the count
    assert not start_phase_finished([1.0, 1.0, 1.0, 0.5, 0.5, 0.5], max_epochs=50, patience=3, tolerance=1e-4)


# ---- tensor selection and the ALA pass on a model with BatchNorm ----


def bn_model() -> SplitModel:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        encoder = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 6)
        )
        head = nn.Linear(6, 3)
    return SplitModel(encoder=encoder, head=head)


def bn_context(batch_size: int = 8) -> HostClientContext:
    model = bn_model()
    generator = torch.Generator().manual_seed(5)
    inputs = torch.randn(40, 1, 6, 6, generator=generator)
    labels = torch.randint(0, 3, (40,), generator=generator)
    return HostClientContext(
        client_id=0,
        round_index=2,
        seed=11,
        model=model,
        encoder_index=FlatIndex.of(model.encoder),
        head_index=FlatIndex.of(model.head),
        protocol=ProtocolConfig(batch_size=batch_size),
        generator=torch.Generator().manual_seed(0),
        _train_data=lambda: (inputs, labels),
        _test_data=lambda: (inputs, labels),
        _raw_train=lambda: (np.zeros((40, 6, 6, 1), np.uint8), labels.numpy()),
    )


def global_and_local(ctx: HostClientContext) -> tuple[ModelParams, ModelParams]:
    """A global model with non-trivial BatchNorm statistics and a local model off it everywhere."""
    global_ = ctx.snapshot()
    rng = np.random.default_rng(1)
    encoder = global_.encoder.copy()
    for entry in ctx.encoder_index.entries:
        if entry.name.endswith(("running_mean", "running_var")):
            encoder[entry.offset : entry.stop] = rng.uniform(0.5, 2.0, entry.size)
    global_ = ModelParams(encoder=encoder, head=global_.head)
    local = ModelParams(
        encoder=(global_.encoder + rng.normal(0, 0.3, global_.encoder.shape)).astype(np.float32),
        head=(global_.head + rng.normal(0, 0.3, global_.head.shape)).astype(np.float32),
    )
    return global_, local


def test_parameter_slots_skip_batchnorm_buffers_and_top_two_are_head_weight_and_bias():
    ctx = bn_context()
    slots = model_slots(ctx)
    names = [(slot.part, slot.name) for slot in slots]
    assert names == [
        ("encoder", "0.weight"), ("encoder", "0.bias"), ("encoder", "1.weight"), ("encoder", "1.bias"),
        ("encoder", "5.weight"), ("encoder", "5.bias"), ("head", "weight"), ("head", "bias"),
    ]  # fmt: skip
    head_weight, head_bias = top_slots(slots, 2)
    # the flat head vector is [W | b]
    assert (head_weight.offset, head_weight.size, head_bias.offset) == (0, 18, 18)
    assert [slot.name for slot in top_slots(slots, 3)] == ["5.bias", "weight", "bias"]
    # slot offsets are those of the flat index, which also holds the BatchNorm buffers
    offsets = {entry.name: entry.offset for entry in ctx.encoder_index.entries}
    assert all(slot.offset == offsets[slot.name] for slot in slots if slot.part == "encoder")


def test_layers_beyond_the_parameter_count_or_unknown_names_are_reported():
    ctx = bn_context()
    with pytest.raises(ValueError, match=r"algorithm\.fedala\.layers: 9 .* 8 parameter tensors \(choose 1\.\.8\)"):
        top_slots(model_slots(ctx), 9)
    with pytest.raises(ValueError, match="head.scale"):
        parameter_slots([], ["scale"], ctx.encoder_index, ctx.head_index)


@pytest.mark.parametrize("layers", [2, 3])
def test_ala_changes_only_the_top_tensors_and_keeps_batchnorm_statistics(layers):
    ctx = bn_context()
    global_, local = global_and_local(ctx)
    params = FedALAParams(layers=layers, start_max_epochs=5)
    outcome = adaptive_local_init(ctx, global_, local, None, True, params, TRAINING_SUBSET_STREAM)
    top = {(slot.part, slot.name) for slot in top_slots(model_slots(ctx), layers)}
    for part, index in (("encoder", ctx.encoder_index), ("head", ctx.head_index)):
        got = getattr(outcome.initial, part)
        expected = getattr(global_, part)
        for entry in index.entries:
            values, global_values = got[entry.offset : entry.stop], expected[entry.offset : entry.stop]
            if (part, entry.name) in top:
                assert not np.array_equal(values, global_values), entry.name  # the blend moved it
            else:
                assert np.array_equal(values, global_values), entry.name  # below H: exactly global
    # the real model's BatchNorm statistics are the global ones again after the ALA pass
    assert np.array_equal(ctx.snapshot().encoder[_buffer_mask(ctx)], global_.encoder[_buffer_mask(ctx)])
    assert outcome.start_phase is False and 1 <= outcome.epochs <= 5
    assert [w.shape for w in outcome.weights] == [slot.shape for slot in top_slots(model_slots(ctx), layers)]


def _buffer_mask(ctx: HostClientContext) -> np.ndarray:
    mask = np.zeros(ctx.encoder_index.total_size, dtype=bool)
    for entry in ctx.encoder_index.entries:
        if entry.name.endswith(("running_mean", "running_var")):
            mask[entry.offset : entry.stop] = True
    assert mask.any()
    return mask


def test_ala_weights_stay_in_unit_interval_with_huge_eta_and_caller_arrays_are_not_written():
    ctx = bn_context()
    global_, local = global_and_local(ctx)
    given = (np.full((3, 6), 0.5, np.float32), np.full(3, 0.5, np.float32))
    outcome = adaptive_local_init(ctx, global_, local, given, False, FedALAParams(eta=1.0e6), TRAINING_SUBSET_STREAM)
    for weights in outcome.weights:
        assert np.isfinite(weights).all() and weights.min() >= 0.0 and weights.max() <= 1.0
    assert all(np.array_equal(w, np.full_like(w, 0.5)) for w in given)
    assert outcome.epochs == 1  # after the start phase: exactly one epoch


def test_start_phase_runs_until_its_epoch_cap_when_patience_cannot_trigger():
    ctx = bn_context()
    global_, local = global_and_local(ctx)
    params = FedALAParams(start_max_epochs=4, start_patience=10)
    outcome = adaptive_local_init(ctx, global_, local, None, True, params, TRAINING_SUBSET_STREAM)
    assert outcome.epochs == 4 and len(outcome.epoch_losses) == 4


def test_first_time_client_takes_the_global_model_unchanged():
    ctx = bn_context()
    global_, _ = global_and_local(ctx)
    weights = (np.full((3, 6), 0.3, np.float32), np.full(3, 0.3, np.float32))
    for local in (None, ModelParams(encoder=global_.encoder.copy(), head=global_.head + 1.0)):
        outcome = adaptive_local_init(ctx, global_, local, weights, True, FedALAParams(), TRAINING_SUBSET_STREAM)
        assert outcome.initial is global_
        assert outcome.epochs == 0 and outcome.start_phase is True
        assert outcome.weights is weights


# ---- the hooks, in an in-process run ----


class RecordingFedALA(FedALA):
    def __init__(self, params: FedALAParams, scenario: Any) -> None:
        super().__init__(params, run_info(scenario))
        self.aggregated: list[tuple[list[ModelParams], list[int]]] = []

    def aggregate(self, state, round_index, uploads):
        ordered = sorted(uploads, key=lambda upload: upload.client_id)
        self.aggregated.append(([u.models["model"] for u in ordered], [u.num_samples for u in ordered]))
        return super().aggregate(state, round_index, uploads)


def ala_run(**params: Any):
    scenario = build_scenario(
        tiny_scenario(
            algorithm={"name": "fedala", "fedala": {"start_max_epochs": 5, **params}},
            protocol={"rounds": 2, "participation": 0.5, "local_epochs": 2, "batch_size": 16},
        )
    )
    algorithm = RecordingFedALA(scenario.algorithm.fedala, scenario)
    return in_process_run(prepare_run(scenario), algorithm=algorithm), algorithm


def test_server_averages_the_whole_model_with_sample_weights():
    run, algorithm = ala_run()
    report = run.run_round(1)
    models, counts = algorithm.aggregated[-1]
    assert len(models) == len(report.selected) == 4
    assert np.array_equal(run.server.state.model.encoder, weighted_average([m.encoder for m in models], counts))
    assert np.array_equal(run.server.state.model.head, weighted_average([m.head for m in models], counts))


def test_participants_keep_their_trained_model_weights_and_phase():
    run, _ = ala_run()
    first = run.run_round(1)
    # round 1: nobody has a local model yet, so every participant skips ALA
    expected = ", ".join(f"{k}:0" for k in first.selected)
    assert f"fedala: ALA weight-learning epochs per participant (client:epochs) {expected}" in first.events
    second = run.run_round(2)
    states = run.host.client_states
    for client_id in range(8):
        state = states[client_id]
        trained_before = client_id in first.selected
        trained_now = client_id in second.selected
        assert (state.local is None) == (not trained_before and not trained_now)
        # ALA ran (and ended the start phase) only for round-2 participants with a round-1 model
        assert state.start_phase is not (trained_before and trained_now)
        if trained_before and trained_now:
            assert all(((w >= 0) & (w <= 1)).all() for w in state.weights)


def test_evaluation_scores_everyone_on_ala_models_without_changing_their_state():
    run, algorithm = ala_run()
    run.run_round(1)
    states_before = {k: v for k, v in run.host.client_states.items()}
    global_model = run.server.state.model
    for client_id in range(8):
        state = states_before[client_id]
        weights_before = None if state.weights is None else [w.copy() for w in state.weights]
        ctx = run.host.context(client_id, 1)
        result = algorithm.evaluate(ctx, state, None, {"global": global_model}, final=False)
        assert result.headline == "personalized"
        assert {"global", "personalized"} <= set(result.references)
        assert ("local" in result.references) == (state.local is not None)
        if state.local is None:  # never trained: ALA takes the global model as it is
            assert result.references["personalized"] == result.references["global"]
        assert run.host.client_states[client_id] is state and state.start_phase is True
        if weights_before is not None:
            assert all(np.array_equal(a, b) for a, b in zip(weights_before, state.weights))


def test_same_scenario_twice_gives_identical_results():
    outcomes = []
    for _ in range(2):
        run, _ = ala_run()
        reports = run.run_all()
        references = [(e.client_id, dict(e.result.references)) for r in reports for e in r.eval_reports]
        outcomes.append((run.server.state.model, references))
    assert np.array_equal(outcomes[0][0].encoder, outcomes[1][0].encoder)
    assert np.array_equal(outcomes[0][0].head, outcomes[1][0].head)
    assert outcomes[0][1] == outcomes[1][1]
