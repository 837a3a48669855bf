"""FedSoft: importance weights, per-centre selection, centre aggregation in every
mode (in "sampled" and "all_clients" each centre is c_s = sum_k v_{s,k} w_k over
every client's latest model, whoever trained this round), the server's copy of
the client models and its checkpoint, the proximal pull toward the centres, and
reproducibility."""

from __future__ import annotations

import numpy as np
import pytest

from hdcfl_ray.maths.aggregate import weighted_average
from hdcfl_ray.algorithms.fedsoft import FedSoft, FedSoftParams
from hdcfl_ray.algorithms.fedsoft_centres import soft_centres
from hdcfl_ray.algorithms.fedsoft_importance import (
    importance_weights,
    select_per_centre,
    server_weights,
)
from hdcfl_ray.algorithms.proximal import (
    parameter_columns,
    proximal_anchor,
    proximal_regulariser,
)
from hdcfl_ray.checkpoint.codec import Decoder, Encoder
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.config.methods import run_info
from hdcfl_ray.contract import ModelParams, RunInfo, Upload
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.runtime.backends.local_host import in_process_run
from hdcfl_ray.runtime.driver import prepare_run
from tests.conftest import PINNED_AUTO_KNOBS, tiny_scenario


class RecordingFedSoft(FedSoft):
    """FedSoft that keeps what its aggregation step saw, for checking the centres."""

    def aggregate(self, state, round_index, uploads):
        self.uploads = {u.client_id: u.models["model"] for u in uploads}
        self.selections = None if state.selections is None else [s.copy() for s in state.selections]
        self.weights = state.weights.copy()
        return super().aggregate(state, round_index, uploads)


def fedsoft_run(protocol=None, **params):
    scenario = build_scenario(tiny_scenario(algorithm={"name": "fedsoft", "fedsoft": params}, protocol=protocol or {}))
    return in_process_run(prepare_run(scenario), algorithm=RecordingFedSoft(scenario.algorithm.fedsoft, run_info(scenario)))


# ---- pure maths ----


def test_importance_weights_sum_to_one_per_client_and_smooth_empty_centres():
    counts = np.array([150, 30, 0])
    u = importance_weights(counts, smoothing=1e-4)
    assert u.sum() == pytest.approx(1.0, abs=1e-12)
    assert u[2] > 0 and u[2] == pytest.approx(1e-4, rel=1e-3)  # sigma * n_k / n_k
    assert u[:2] == pytest.approx([150 / 180, 30 / 180], rel=1e-3)


def test_server_weights_are_importance_times_samples_normalised_per_centre():
    u = np.array([[0.9, 0.1], [0.5, 0.5], [0.2, 0.8]])
    n = np.array([100, 50, 200])
    v = server_weights(u, n)
    assert v.shape == (2, 3)
    assert np.allclose(v.sum(axis=1), 1.0)
    assert v[0, 0] == pytest.approx(90 / (90 + 25 + 40))
    assert v[1, 2] == pytest.approx(160 / (10 + 25 + 160))


def flat(model) -> np.ndarray:
    return np.concatenate([model.encoder, model.head]).astype(np.float64)


def direct_centres(weights, models) -> list[np.ndarray]:
    """c_s = sum_k v_{s,k} w_k, written out over every client."""
    return [sum(float(weights[s, k]) * flat(models[k]) for k in range(len(models))) for s in range(weights.shape[0])]


def test_soft_centres_are_the_importance_weighted_sums_over_every_client_model():
    rng = np.random.default_rng(3)
    models = [ModelParams(rng.normal(size=7).astype(np.float32), rng.normal(size=3).astype(np.float32)) for _ in range(5)]
    v = server_weights(rng.dirichlet(np.ones(2), size=5), rng.integers(10, 100, size=5))
    centres = soft_centres(v, models)
    for centre, expected in zip(centres, direct_centres(v, models)):
        assert np.allclose(flat(centre), expected, rtol=1e-6, atol=1e-6)


def test_soft_centres_skip_zero_weights_and_leave_a_weightless_centre_to_the_caller():
    models = [ModelParams(np.full(4, float(k), np.float32), np.full(2, float(k), np.float32)) for k in range(3)]
    v = np.array([[0.5, 0.0, 0.5], [0.0, 0.0, 0.0]])  # a zero row needs sigma = 0
    first, second = soft_centres(v, models)
    assert np.array_equal(first.encoder, np.full(4, 1.0, np.float32))
    assert second is None
    with pytest.raises(ValueError, match="one column per model"):
        soft_centres(v[:, :2], models)


def test_per_centre_selection_draws_k_sel_distinct_clients_with_positive_weight():
    weights = np.array([[0.0, 0.2, 0.2, 0.2, 0.2, 0.2], [0.5, 0.1, 0.1, 0.1, 0.1, 0.1]])
    rng = np.random.default_rng(0)
    for _ in range(200):
        first, second = select_per_centre(weights, 3, rng)
        assert len(first) == len(set(first.tolist())) == 3
        assert len(second) == len(set(second.tolist())) == 3
        assert 0 not in first  # a client with v_{s,k} = 0 is never drawn for s


def test_proximal_anchor_rewrites_the_weighted_sum_of_distances():
    rng = np.random.default_rng(1)
    centres = rng.normal(size=(3, 20))
    u = np.array([0.6, 0.3, 0.1])
    anchor, spread = proximal_anchor(centres, u)
    for w in rng.normal(size=(4, 20)):
        direct = sum(u[s] * np.sum((w - centres[s]) ** 2) for s in range(3))
        assert u.sum() * np.sum((w - anchor) ** 2) + spread == pytest.approx(direct, rel=1e-5)


def test_proximal_term_covers_parameters_and_skips_batchnorm_statistics():
    from torch import nn

    from hdcfl_ray.models import FlatIndex

    module = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    index = FlatIndex.of(module)
    columns = parameter_columns(index.entries, [name for name, _ in module.named_parameters()])
    covered = sum(c.stop - c.start for c in columns)
    assert covered == 3 * 4 + 4 + 4 + 4  # linear W, b; BN weight, bias
    assert index.total_size == covered + 4 + 4  # running mean and var are left out


# ---- whole rounds ----


def test_importance_weights_from_a_run_sum_to_one_and_follow_the_argmin_counts():
    run = fedsoft_run(centers=3, selection=3, selection_mode="select")
    centres = list(run.server.state.centres)
    run.run_round(1)
    importance = run.server.state.importance
    assert np.allclose(importance.sum(axis=1), 1.0)
    for client_id in range(8):
        ctx = run.host.context(client_id, 1)
        losses = np.stack([ctx.per_sample_losses(c) for c in centres])
        counts = np.bincount(np.argmin(losses, axis=0), minlength=3).astype(float)
        filled = np.where(counts == 0, 1e-4 * counts.sum(), counts)
        assert np.allclose(importance[client_id], filled / filled.sum())


def test_selected_centre_is_the_unweighted_mean_of_the_clients_selected_for_it():
    run = fedsoft_run(centers=3, selection=3, selection_mode="select")
    report = run.run_round(1)
    algorithm = run.algorithm
    assert algorithm.selections is not None
    assert report.selected == sorted({int(k) for chosen in algorithm.selections for k in chosen})
    for s, chosen in enumerate(algorithm.selections):
        assert len(chosen) == len(set(chosen.tolist())) == 3
        expected_encoder = weighted_average([algorithm.uploads[int(k)].encoder for k in chosen], [1.0] * 3)
        expected_head = weighted_average([algorithm.uploads[int(k)].head for k in chosen], [1.0] * 3)
        assert np.array_equal(run.server.state.centres[s].encoder, expected_encoder)
        assert np.array_equal(run.server.state.centres[s].head, expected_head)
        assert any(f"centre {s} selected {chosen.tolist()}" in event for event in report.events)


def test_all_clients_mode_centre_is_the_importance_weighted_average_of_all_clients():
    run = fedsoft_run(centers=3, selection_mode="all_clients", protocol={"participation": 0.5})
    report = run.run_round(1)
    algorithm = run.algorithm
    clients = sorted(algorithm.uploads)
    assert clients == list(range(8)) == report.selected
    for s in range(3):
        v = [float(algorithm.weights[s, k]) for k in clients]
        assert sum(v) == pytest.approx(1.0)
        expected = weighted_average([algorithm.uploads[k].encoder for k in clients], v)
        assert np.array_equal(run.server.state.centres[s].encoder, expected)


def test_default_mode_trains_only_the_runtimes_sample_and_weights_every_clients_model_by_importance():
    # round 1: the four sampled clients hold their uploads, the other four still the initial model
    run = fedsoft_run(centers=3, protocol={"participation": 0.5})
    initial = run.host.client_states[0].model
    report = run.run_round(1)
    algorithm = run.algorithm
    sampled = sorted(algorithm.uploads)
    assert len(sampled) == 4 and report.selected == sampled  # the same budget as any other method
    latest = [algorithm.uploads[k] if k in algorithm.uploads else initial for k in range(8)]
    for s in range(3):
        expected = weighted_average([m.encoder for m in latest], [float(algorithm.weights[s, k]) for k in range(8)])
        assert np.array_equal(run.server.state.centres[s].encoder, expected)
    assert any("selection_mode=sampled" in event for event in report.events)


def two_community_fedsoft(num_clients=6):
    """FedSoft's server with two centres, clients 0-2 importance-weighted almost
    wholly on centre 0 and 3-5 on centre 1 (sigma floor 1e-4 on the other), and
    client k's model filled with the value k."""
    algorithm = FedSoft(FedSoftParams(**{**PINNED_AUTO_KNOBS["fedsoft"], "centers": 2}), RunInfo(seed=0, rounds=3))
    zero = ModelParams(np.zeros(4, np.float32), np.zeros(2, np.float32))
    state = algorithm.init_server(zero, [zero, zero], num_clients)
    for k in range(num_clients):
        counts = np.array([100, 0]) if k < num_clients // 2 else np.array([0, 100])
        state.importance[k] = importance_weights(counts, 1e-4)
        state.num_samples[k] = 100
    state.weights = server_weights(state.importance, state.num_samples)
    return algorithm, state


def upload_of(client_id, value):
    model = ModelParams(np.full(4, value, np.float32), np.full(2, value, np.float32))
    return Upload(client_id=client_id, num_samples=100, train_loss=0.0, steps=1, models={"model": model})


def test_a_centre_with_no_sampled_member_is_built_from_every_clients_latest_model_not_from_the_sampled_strangers():
    algorithm, state = two_community_fedsoft()
    online = list(range(6))
    algorithm.select(state, 1, sampled=online, online=online)
    algorithm.aggregate(state, 1, [upload_of(k, float(k)) for k in online])  # every w_k = k
    # round 2: only centre 0's members (0, 1, 2) are sampled; they move to 10, 11, 12
    algorithm.select(state, 2, sampled=[0, 1, 2], online=online)
    algorithm.aggregate(state, 2, [upload_of(k, 10.0 + k) for k in (0, 1, 2)])

    latest = [upload_of(k, value).models["model"] for k, value in enumerate([10.0, 11.0, 12.0, 3.0, 4.0, 5.0])]
    expected = direct_centres(state.weights, latest)
    for s in range(2):
        assert np.allclose(flat(state.centres[s]), expected[s], rtol=1e-6)
    # centre 1 stays with its own members' models (mean 4) plus the sigma-floor share of the others
    assert flat(state.centres[1]) == pytest.approx(np.full(6, 4.0), abs=0.01)
    # renormalising v over the round's uploads would have made it their average (11): strangers only
    assert not np.allclose(flat(state.centres[1]), 11.0, atol=1.0)
    assert [flat(m)[0] for m in state.clients] == [10.0, 11.0, 12.0, 3.0, 4.0, 5.0]


def test_sampled_centres_match_the_direct_sum_over_every_clients_latest_model_after_several_rounds():
    run = fedsoft_run(centers=2, importance_every=1, protocol={"participation": 0.5, "rounds": 4})
    algorithm = run.algorithm
    latest = {k: run.host.client_states[k].model for k in range(8)}  # the shared initial model
    trained = set()
    for round_index in range(1, 5):
        run.run_round(round_index)
        latest.update(algorithm.uploads)
        trained.update(algorithm.uploads)
        state = run.server.state
        # the server's copy of w_k is the client's own current model, trained this round or not
        for k in range(8):
            assert np.array_equal(flat(state.clients[k]), flat(run.host.client_states[k].model))
            assert np.array_equal(flat(state.clients[k]), flat(latest[k]))
        for s, expected in enumerate(direct_centres(algorithm.weights, [latest[k] for k in range(8)])):
            assert np.allclose(flat(state.centres[s]), expected, rtol=1e-5, atol=1e-6)
    assert len(trained) > 4  # several rounds, different samples: more than one round's clients are in the sum


def test_the_client_models_round_trip_through_a_checkpoint():
    run = fedsoft_run(centers=2, protocol={"participation": 0.5})
    run.run_round(1)
    state = run.server.state
    encoder = Encoder()
    restored = Decoder(encoder.arrays).decode(encoder.encode(state))
    assert len(restored.clients) == 8
    for kept, back in zip(state.clients, restored.clients):
        assert np.array_equal(kept.encoder, back.encoder) and np.array_equal(kept.head, back.head)
        assert back.encoder.dtype == np.float32 and back.encoder.flags.writeable


def test_a_checkpoint_without_client_models_is_refused_with_a_clear_message():
    # a server state written before FedSoft kept every client's latest model
    algorithm, state = two_community_fedsoft()
    encoder = Encoder()
    encoded = encoder.encode(state)
    del encoded["fields"]["clients"]
    restored = Decoder(encoder.arrays).decode(encoded)
    algorithm.select(restored, 1, sampled=[0], online=[0])
    with pytest.raises(ScenarioError, match="start the run again"):
        algorithm.aggregate(restored, 1, [upload_of(0, 1.0)])


def test_select_mode_keeps_no_client_models():
    run = fedsoft_run(centers=2, selection=3, selection_mode="select")
    run.run_round(1)
    assert run.server.state.clients is None


def test_forced_selection_mode_keeps_per_centre_draws_even_with_many_slots():
    run = fedsoft_run(centers=2, selection=20, selection_mode="select")
    report = run.run_round(1)
    assert not run.server.state.weighted
    assert [len(s) for s in run.algorithm.selections] == [8, 8]
    assert any("every centre selects all clients" in event for event in report.events)


def excess_distance(model, centres, u) -> float:
    """sum_s u_s ||w - c_s||^2 above its minimum over w (reached at the anchor)."""
    vectors = np.stack([np.concatenate([c.encoder, c.head]) for c in centres])
    _, spread = proximal_anchor(vectors, u)
    w = np.concatenate([model.encoder, model.head]).astype(np.float64)
    return sum(float(u[s]) * float(np.sum((w - vectors[s]) ** 2)) for s in range(len(centres))) - spread


def test_a_huge_proximal_weight_keeps_client_models_closer_to_the_centres():
    # one SGD step per round (batch larger than any client); lr * lambda = 1
    excess = {}
    for strength in (0.0, 20.0):
        run = fedsoft_run(centers=2, proximal=strength, protocol={"batch_size": 256})
        centres = list(run.server.state.centres)
        run.run_round(1)
        u = run.server.state.importance
        excess[strength] = [excess_distance(run.host.client_states[k].model, centres, u[k]) for k in range(8)]
    assert all(pulled < 0.05 * free for pulled, free in zip(excess[20.0], excess[0.0]))


def test_proximal_regulariser_equals_the_direct_weighted_sum_of_distances():
    run = fedsoft_run(centers=3, selection=3, selection_mode="select")
    centres = list(run.server.state.centres)
    ctx = run.host.context(0, 1)
    u = np.array([0.5, 0.3, 0.2])
    ctx.load(run.host.client_states[0].model)
    value = float(proximal_regulariser(ctx, centres, u, strength=0.4)(ctx.model).detach())
    w = np.concatenate([run.host.client_states[0].model.encoder, run.host.client_states[0].model.head]).astype(np.float64)
    direct = sum(u[s] * np.sum((w - np.concatenate([c.encoder, c.head])) ** 2) for s, c in enumerate(centres))
    assert value == pytest.approx(0.2 * direct, rel=1e-4)


def test_evaluation_scores_the_own_model_and_reports_the_dominant_centre():
    run = fedsoft_run(centers=3, selection=3, selection_mode="select")
    report = run.run_round(1)
    for evaluation in report.eval_reports:
        u = run.server.state.importance[evaluation.client_id]
        result = evaluation.result
        assert result.headline == "personalized"
        assert result.group == int(np.argmax(u))
        assert result.memberships == pytest.approx(tuple(u))
        ctx = run.host.context(evaluation.client_id, 1)
        assert result.references["personalized"] == ctx.score(run.host.client_states[evaluation.client_id].model)


def test_same_scenario_twice_gives_identical_centres_and_scores():
    def outcome():
        run = fedsoft_run(centers=2, selection=3, selection_mode="select", importance_every=1, protocol={"rounds": 2})
        reports = run.run_all()
        centres = [np.concatenate([c.encoder, c.head]) for c in run.server.state.centres]
        return centres, [r.selected for r in reports], [[e.result for e in r.eval_reports] for r in reports]

    first, second = outcome(), outcome()
    assert all(np.array_equal(a, b) for a, b in zip(first[0], second[0]))
    assert first[1:] == second[1:]
