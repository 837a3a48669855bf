"""PACFL: subspace angles, one-shot agglomerative clustering, FedAvg inside fixed clusters."""

from __future__ import annotations

import numpy as np
import pytest

from hdcfl_ray.contract import ModelParams
from hdcfl_ray.algorithms.pacfl import PACFL
from hdcfl_ray.algorithms.pacfl_subspaces import (
    agglomerative_clusters,
    client_basis,
    data_matrix,
    elementwise_min_angle,
    proximity_matrix,
    smallest_principal_angle,
    threshold_in_radians,
)
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.config.methods import run_info
from hdcfl_ray.algorithms.pacfl import PACFLParams
from hdcfl_ray.runtime.backends.local_host import in_process_run
from hdcfl_ray.runtime.driver import prepare_run
from tests.conftest import tiny_scenario

# digits, rotation [0, 180]: with the element-wise measure same-angle clients sit
# 4-6 degrees apart and the two angles 10-14 degrees apart.
CALIBRATED = {"proximity": "elementwise", "threshold": 8.5, "threshold_unit": "degrees"}


def planted_bases(kind: str, groups: int = 3, per_group: int = 4, seed: int = 0) -> tuple[list[np.ndarray], np.ndarray]:
    """Client i holds 60 noisy samples of group (i mod groups)'s own 3-dim subspace of R^50."""
    rng = np.random.default_rng(seed)
    subspaces = [np.linalg.qr(rng.normal(size=(50, 3)))[0] for _ in range(groups)]
    truth = np.arange(groups * per_group) % groups
    bases = []
    for group in truth:
        samples = subspaces[group] @ rng.normal(size=(3, 60)) * 10.0 + rng.normal(scale=0.05, size=(50, 60))
        bases.append(client_basis(samples, rng.integers(0, 2, size=60), basis_dim=3, kind=kind))
    return bases, truth


def pacfl_run(rounds: int = 1, **pacfl):
    prepared = prepare_run(
        build_scenario(tiny_scenario(algorithm={"name": "pacfl", "pacfl": pacfl}, protocol={"rounds": rounds, "participation": 0.5}))
    )
    return in_process_run(prepared, algorithm=PACFL(prepared.scenario.algorithm.pacfl, run_info(prepared.scenario)))


def fake_model(value: float) -> ModelParams:
    return ModelParams(encoder=np.full(4, value, dtype=np.float32), head=np.full(2, value, dtype=np.float32))


def server_only(**params) -> PACFL:
    return PACFL(PACFLParams(**params), run_info(build_scenario(tiny_scenario(algorithm={"name": "pacfl"}))))


# ---- pure maths ----


def test_data_matrix_has_one_raw_column_per_sample():
    images = np.arange(2 * 2 * 2 * 3, dtype=np.uint8).reshape(2, 2, 2, 3)
    matrix = data_matrix(images)
    assert matrix.shape == (12, 2) and matrix.dtype == np.float64
    assert np.array_equal(matrix[:, 1], images[1].reshape(-1).astype(np.float64))


def test_per_class_basis_concatenates_p_vectors_for_each_class_present():
    rng = np.random.default_rng(1)
    matrix, labels = rng.normal(size=(20, 40)), np.repeat([0, 3, 7], [10, 10, 20])
    assert client_basis(matrix, labels, basis_dim=3, kind="per_class").shape == (20, 9)
    assert client_basis(matrix, labels, basis_dim=3, kind="whole").shape == (20, 3)


@pytest.mark.parametrize("kind", ["per_class", "whole"])
def test_recovers_planted_subspace_groups(kind):
    bases, truth = planted_bases(kind)
    labels = agglomerative_clusters(proximity_matrix(bases, "principal"), threshold_radians=0.5, linkage_name="average")
    assert np.array_equal(labels, truth)  # labels are numbered by first appearance, as truth is


def test_angles_ignore_the_sign_of_singular_vectors():
    bases, _ = planted_bases("whole")
    flipped = bases[1] * np.array([-1.0, 1.0, -1.0])
    assert elementwise_min_angle(bases[0], flipped) == pytest.approx(elementwise_min_angle(bases[0], bases[1]))
    assert smallest_principal_angle(bases[0], flipped) == pytest.approx(smallest_principal_angle(bases[0], bases[1]))


def test_average_linkage_is_the_reference_mean_of_rows_rule_not_size_weighted():
    # a, b merge at 1, then c at 2; the distance from {a, b, c} to d is then the mean of
    # the two merged rows, (mean(6, 6) + 3) / 2 = 4.5 (WPGMA), not (6 + 6 + 3) / 3 = 5 (UPGMA)
    proximity = np.array([[0, 1, 2, 6], [1, 0, 2, 6], [2, 2, 0, 3], [6, 6, 3, 0]], dtype=np.float64)
    assert agglomerative_clusters(proximity, 4.49, "average").tolist() == [0, 0, 0, 1]
    assert agglomerative_clusters(proximity, 4.5, "average").tolist() == [0, 0, 0, 0]


def test_threshold_in_degrees_gives_the_same_clusters_as_in_radians():
    assert threshold_in_radians(85.94, "degrees") == pytest.approx(1.5, abs=1e-4)
    proximity = np.array([[0.0, 1.2, 1.6, 1.7], [1.2, 0.0, 1.65, 1.8], [1.6, 1.65, 0.0, 1.3], [1.7, 1.8, 1.3, 0.0]])
    in_radians = agglomerative_clusters(proximity, server_only(threshold=1.5).threshold_radians, "average")
    in_degrees = agglomerative_clusters(proximity, server_only(threshold=85.94, threshold_unit="degrees").threshold_radians, "average")
    assert in_radians.tolist() == in_degrees.tolist() == [0, 0, 1, 1]


# ---- server hooks ----


def test_every_cluster_starts_from_the_one_shared_initial_model():
    pacfl = server_only(threshold=0.5)
    state = pacfl.init_server(fake_model(3.0), [], num_clients=12)
    bases, truth = planted_bases("whole")
    notes = pacfl.absorb_probes(state, 1, {k: {"basis": basis} for k, basis in enumerate(bases)})
    assert [state.labels[k] for k in range(12)] == truth.tolist()
    assert len(state.models) == 3
    assert all(np.array_equal(model.encoder, fake_model(3.0).encoder) for model in state.models)
    assert any("3 cluster(s)" in event and "sizes [4, 4, 4]" in event for event in notes.events)


def test_a_threshold_that_merges_everyone_yields_one_cluster_and_says_how_to_set_it():
    pacfl = server_only(threshold=3.0)
    state = pacfl.init_server(fake_model(0.0), [], num_clients=12)
    bases, _ = planted_bases("whole")
    notes = pacfl.absorb_probes(state, 1, {k: {"basis": basis} for k, basis in enumerate(bases)})
    assert set(state.labels.values()) == {0} and len(state.models) == 1
    merged = [event for event in notes.events if "merges all 12 clients into one cluster" in event]
    assert merged and "algorithm.pacfl.threshold" in merged[0] and "smallest" in merged[0] and "median" in merged[0]


# ---- in-process rounds on digits ----


def test_clusters_are_computed_once_and_never_again():
    run = pacfl_run(rounds=3, **CALIBRATED)
    probed = []
    original_probe = run.algorithm.probe
    run.algorithm.probe = lambda ctx, *rest: probed.append((ctx.round_index, ctx.client_id)) or original_probe(ctx, *rest)
    run.run_round(1)
    clusters = dict(run.server.state.labels)
    assert probed == [(1, k) for k in range(8)]
    for round_index in (2, 3):
        assert all(run.algorithm.probe_task(run.server.state, round_index, k) is None for k in range(8))
        report = run.run_round(round_index)
        assert run.server.state.labels == clusters
        assert [e.result.group for e in report.eval_reports] == [clusters[k] for k in range(8)]
    assert len(probed) == 8


def test_calibrated_threshold_finds_the_two_rotation_groups_on_digits():
    run = pacfl_run(rounds=1, **CALIBRATED)
    report = run.run_round(1)
    assert [run.server.state.labels[k] for k in range(8)] == [k % 2 for k in range(8)]
    assert [e.result.group for e in report.eval_reports] == [k % 2 for k in range(8)]
    assert all(e.result.headline == "personalized" for e in report.eval_reports)
    assert any("2 cluster(s)" in event and "8.5 degrees" in event for event in report.events)


def test_default_threshold_on_digits_merges_everyone_and_the_log_says_so():
    run = pacfl_run(rounds=1)  # per-class bases, smallest principal angle, 1.5 rad
    report = run.run_round(1)
    assert set(run.server.state.labels.values()) == {0}
    assert any("1.5 radians" in event and "merges all 8 clients into one cluster" in event for event in report.events)


def test_same_scenario_twice_gives_identical_clusters_models_and_scores():
    def outcome():
        run = pacfl_run(rounds=2, **CALIBRATED)
        reports = run.run_all()
        return run.server.state, [(e.client_id, e.result.group, e.result.references["personalized"]) for e in reports[-1].eval_reports]

    (first_state, first_scores), (second_state, second_scores) = outcome(), outcome()
    assert first_state.labels == second_state.labels and first_scores == second_scores
    assert np.array_equal(first_state.proximity, second_state.proximity)
    for first, second in zip(first_state.models, second_state.models):
        assert np.array_equal(first.encoder, second.encoder) and np.array_equal(first.head, second.head)
