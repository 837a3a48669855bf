"""FedCE (reconstructed): sample-level assignment, mixing weights, per-subset
training, sample-weighted cluster aggregation and the membership ensemble."""

from __future__ import annotations

import numpy as np
import pytest

from hdcfl_ray.algorithms.aggregate import weighted_average
from hdcfl_ray.algorithms.base import ModelParams, Upload
from hdcfl_ray.algorithms.fedce import FedCE, aggregate_clusters, mix_outputs
from hdcfl_ray.algorithms.importance import merge_small_subsets, mixing_weights
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.runtime.inprocess import in_process_run
from hdcfl_ray.runtime.simulation import prepare_run
from tests.conftest import tiny_scenario


class RecordingFedCE(FedCE):
    """FedCE that keeps the uploads and cluster models its aggregation step saw."""

    def aggregate(self, state, round_index, uploads):
        self.uploads = list(uploads)
        self.before = list(state.clusters)
        return super().aggregate(state, round_index, uploads)


def fedce_run(protocol=None, **params):
    scenario = build_scenario(tiny_scenario(algorithm={"name": "fedce", "fedce": params}, protocol=protocol or {}))
    return in_process_run(prepare_run(scenario), algorithm=RecordingFedCE(scenario.algorithm.fedce, scenario))


def model(value: float, size: int = 4) -> ModelParams:
    return ModelParams(encoder=np.full(size, value, dtype=np.float32), head=np.full(2, value, dtype=np.float32))


def upload(client_id: int, counts: list[int], models: dict[str, ModelParams]) -> Upload:
    return Upload(client_id, sum(counts), 0.0, 1, models=models, values={"counts": np.asarray(counts)})


# ---- pure maths ----


def test_mixing_weights_are_smoothed_normalised_argmin_counts():
    pi = mixing_weights(np.array([120, 60, 0, 0]), smoothing=1e-4)
    floor = 1e-4 * 180
    assert pi == pytest.approx(np.array([120, 60, floor, floor]) / (180 + 2 * floor))


def test_small_subsets_merge_into_the_largest():
    assignment = np.array([0, 1, 1, 1, 1, 2, 2, 1, 3])
    merged = merge_small_subsets(assignment, num_models=4, min_subset=3)
    assert merged.tolist() == [1, 1, 1, 1, 1, 1, 1, 1, 1]
    untouched = merge_small_subsets(assignment, num_models=4, min_subset=1)
    assert untouched.tolist() == assignment.tolist()
    # the largest subset stays even when it is itself below the minimum
    assert merge_small_subsets(np.array([2, 2, 0]), 3, min_subset=10).tolist() == [2, 2, 2]


def test_server_cluster_is_the_count_weighted_average_and_untrained_clusters_stay():
    clusters = [model(0.0), model(5.0), model(9.0)]
    uploads = [
        upload(0, [3, 1, 0], {"cluster_0": model(1.0), "cluster_1": model(2.0)}),
        upload(1, [1, 0, 0], {"cluster_0": model(5.0)}),
    ]
    updated, samples = aggregate_clusters(clusters, uploads)
    assert updated[0].encoder == pytest.approx(np.full(4, (3 * 1.0 + 1 * 5.0) / 4))
    assert np.array_equal(updated[1].head, model(2.0).head)
    assert updated[2] is clusters[2]
    assert samples == [4, 1, 0]


def test_output_ensemble_accuracy_matches_a_hand_computed_toy():
    import torch

    from hdcfl_ray.runtime.client_context import stats_from_probabilities

    first = torch.tensor([[0.9, 0.1], [0.6, 0.4], [0.2, 0.8]])
    second = torch.tensor([[0.1, 0.9], [0.1, 0.9], [0.3, 0.7]])
    labels = torch.tensor([0, 1, 1])
    mixed = mix_outputs([first, second], [0.25, 0.75])
    # by hand: [0.3, 0.7], [0.225, 0.775], [0.275, 0.725] -> predictions 1, 1, 1
    assert torch.allclose(mixed, torch.tensor([[0.3, 0.7], [0.225, 0.775], [0.275, 0.725]]))
    stats = stats_from_probabilities(mixed, labels)
    assert stats.accuracy == pytest.approx(2 / 3)
    assert stats.loss == pytest.approx(-(np.log(0.3) + np.log(0.775) + np.log(0.725)) / 3, rel=1e-5)


# ---- whole rounds ----


def independent_mixing(ctx, clusters, smoothing=1e-4) -> np.ndarray:
    losses = np.stack([ctx.per_sample_losses(c) for c in clusters])
    counts = np.bincount(np.argmin(losses, axis=0), minlength=len(clusters)).astype(float)
    floored = np.maximum(counts, smoothing * counts.sum())
    return floored / floored.sum()


def test_ensemble_weights_follow_the_clients_sample_assignments():
    run = fedce_run(clusters=3)
    clusters = list(run.server.state.clusters)
    report = run.run_round(1)
    for client_id in range(8):
        expected = independent_mixing(run.host.context(client_id, 1), clusters)
        assert np.allclose(run.host.client_states[client_id].mixing, expected)
    # at evaluation every client's pi is recomputed with the aggregated models
    for evaluation in report.eval_reports:
        expected = independent_mixing(run.host.context(evaluation.client_id, 1), run.server.state.clusters)
        assert evaluation.result.memberships == pytest.approx(tuple(expected))
        assert evaluation.result.group == int(np.argmax(expected))


def test_server_cluster_equals_the_count_weighted_average_of_its_uploads():
    run = fedce_run(clusters=3, min_subset=1)
    run.run_round(1)
    uploads = run.algorithm.uploads
    for s in range(3):
        name = f"cluster_{s}"
        contributing = [u for u in uploads if name in u.models]
        assert all(int(u.values["counts"][s]) > 0 for u in contributing)
        if not contributing:
            assert run.server.state.clusters[s] is run.algorithm.before[s]
            continue
        counts = [int(u.values["counts"][s]) for u in contributing]
        expected = weighted_average([u.models[name].encoder for u in contributing], counts)
        assert np.array_equal(run.server.state.clusters[s].encoder, expected)
    # every sample trained exactly one cluster model
    assert all(int(u.values["counts"].sum()) == u.num_samples for u in uploads)


def test_huge_min_subset_trains_one_model_per_client_and_leaves_the_rest_unchanged():
    run = fedce_run(clusters=3, min_subset=10_000, protocol={"participation": 1})
    report = run.run_round(1)
    (only,) = run.algorithm.uploads
    assert len(only.models) == 1
    trained = int(only.values["counts"].argmax())
    assert list(only.models) == [f"cluster_{trained}"]
    for s in range(3):
        same = np.array_equal(run.server.state.clusters[s].encoder, run.algorithm.before[s].encoder)
        assert same == (s != trained)
    assert report.selected == [only.client_id]


def test_output_ensemble_score_equals_the_ensemble_computed_by_hand():
    from hdcfl_ray.runtime.client_context import stats_from_probabilities

    run = fedce_run(clusters=2)
    report = run.run_round(1)
    clusters = run.server.state.clusters
    for evaluation in report.eval_reports[:3]:
        ctx = run.host.context(evaluation.client_id, 1)
        pi = independent_mixing(ctx, clusters)
        mixed = sum(float(pi[s]) * ctx.probabilities(clusters[s]) for s in range(2))
        expected = stats_from_probabilities(mixed, ctx.test_data()[1])
        scored = evaluation.result.references["personalized"]
        assert scored.accuracy == pytest.approx(expected.accuracy)
        assert scored.loss == pytest.approx(expected.loss, rel=1e-5)


def test_parameter_ensemble_scores_the_membership_weighted_mixture():
    run = fedce_run(clusters=2, ensemble="parameter")
    report = run.run_round(1)
    clusters = run.server.state.clusters
    evaluation = report.eval_reports[0]
    ctx = run.host.context(evaluation.client_id, 1)
    pi = independent_mixing(ctx, clusters)
    mixture = ModelParams(
        weighted_average([c.encoder for c in clusters], pi), weighted_average([c.head for c in clusters], pi)
    )
    assert evaluation.result.references["personalized"] == ctx.score(mixture)
    assert any("parameter-space ensemble" in event for event in report.events)


def test_same_scenario_twice_gives_identical_clusters_and_scores():
    def outcome():
        run = fedce_run(clusters=2, protocol={"rounds": 2})
        reports = run.run_all()
        clusters = [np.concatenate([c.encoder, c.head]) for c in run.server.state.clusters]
        return clusters, [[e.result for e in r.eval_reports] for r in reports]

    first, second = outcome(), outcome()
    assert all(np.array_equal(a, b) for a, b in zip(first[0], second[0]))
    assert first[1] == second[1]
