"""FedSoft: importance weights, per-centre selection, centre aggregation in both
modes, the proximal pull toward the centres, and reproducibility."""

from __future__ import annotations

import numpy as np
import pytest

from hdcfl_ray.algorithms.aggregate import weighted_average
from hdcfl_ray.algorithms.fedsoft import FedSoft
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
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.config.methods import run_info
from hdcfl_ray.runtime.backends.local_host import in_process_run
from hdcfl_ray.runtime.driver import prepare_run
from tests.conftest import tiny_scenario


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


def test_default_mode_trains_only_the_runtimes_sample_and_weights_its_uploads_by_importance():
    run = fedsoft_run(centers=3, protocol={"participation": 0.5})
    report = run.run_round(1)
    algorithm = run.algorithm
    clients = sorted(algorithm.uploads)
    assert len(clients) == 4 and report.selected == clients  # the same budget as any other method
    for s in range(3):
        v = [float(algorithm.weights[s, k]) for k in clients]
        expected = weighted_average([algorithm.uploads[k].encoder for k in clients], v)
        assert np.array_equal(run.server.state.centres[s].encoder, expected)
    assert any("selection_mode=sampled" in event for event in report.events)


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
