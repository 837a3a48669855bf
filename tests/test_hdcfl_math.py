"""HDC-FL's maths as a spec: descriptors, grouping, memberships, prototypes,
personalised encoders and one full refresh (docs/hdcfl.md, sections 1-5)."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np
import pytest

from hdcfl_ray import seeding
from hdcfl_ray.maths.aggregate import weighted_average
from hdcfl_ray.diagnostics.clustering import adjusted_rand, membership_entropy
from hdcfl_ray.hdcfl.descriptors import lowrank_descriptors, raw_descriptors
from hdcfl_ray.hdcfl.grouping import group_clients
from hdcfl_ray.hdcfl.membership import hard_memberships, soft_memberships
from hdcfl_ray.hdcfl.prototypes import group_prototypes, personalised_encoder
from hdcfl_ray.hdcfl.refresh import refresh_groups, refresh_summary, run_refresh

ENCODERS = np.array([[1.0, 2.0], [3.0, 6.0], [5.0, -1.0]], np.float32)
COUNTS = np.array([10.0, 30.0, 60.0])


def hdcfl_params(**changes: object) -> SimpleNamespace:
    """The HDC-FL defaults of docs/hdcfl.md, with `changes` applied."""
    defaults = dict(descriptor="lowrank", rank=8, groups=4, membership="soft", temperature=1.0, temperature_scale="within", prototypes="hard", kmeans_init=10)
    return SimpleNamespace(**{**defaults, **changes})


def planted_heads(noise: float = 0.05, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """4 groups of 5 noisy heads around 4 random centres, dimension 640, groups interleaved."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(4, 640))
    truth = np.arange(20) % 4
    heads = centres[truth] + noise * rng.normal(size=(20, 640))
    return heads.astype(np.float32), truth


def test_descriptors_ignore_the_scale_of_a_head() -> None:
    heads, _ = planted_heads()
    scaled = heads.copy()
    scaled[[1, 6, 13]] *= np.float32(3.7)
    for build in (lambda h: lowrank_descriptors(h, 8), raw_descriptors):
        np.testing.assert_allclose(build(scaled).vectors, build(heads).vectors, atol=1e-6)


def test_descriptors_are_unit_vectors_of_the_rank_asked_for_capped_at_clients_minus_one() -> None:
    heads, _ = planted_heads()
    descriptors = lowrank_descriptors(heads, rank=8)
    assert descriptors.vectors.shape == (20, 8) and descriptors.effective_rank == 8
    np.testing.assert_allclose(np.linalg.norm(descriptors.vectors, axis=1), 1.0, atol=1e-12)
    five_heads = np.random.default_rng(2).normal(size=(5, 300)).astype(np.float32)
    assert lowrank_descriptors(five_heads, rank=8).vectors.shape == (5, 4)


def test_effective_rank_is_capped_at_the_numerical_rank() -> None:
    # Unit-normalising maps a 2-dim linear subspace onto itself (an affine one would
    # gain a dimension), so these 6 heads keep rank 2 after normalising and centring.
    rng = np.random.default_rng(3)
    basis = rng.normal(size=(2, 640))
    heads = (rng.normal(size=(6, 2)) @ basis) * rng.uniform(0.5, 4.0, size=(6, 1))
    descriptors = lowrank_descriptors(heads.astype(np.float32), rank=8)
    assert descriptors.effective_rank <= 2 and descriptors.vectors.shape == (6, descriptors.effective_rank)


def test_identical_heads_have_rank_zero_and_fall_into_one_group() -> None:
    heads = np.tile(np.arange(1.0, 9.0, dtype=np.float32), (4, 1))
    result = refresh_groups(heads, np.eye(4, 3, dtype=np.float32), np.ones(4), hdcfl_params(), seed=0)
    assert result.effective_rank == 0 and np.array_equal(result.labels, np.zeros(4, dtype=np.int64))
    assert result.prototypes.shape == (1, 3)


@pytest.mark.parametrize("kind", ["lowrank", "raw"])
def test_planted_groups_are_recovered_exactly(kind: str) -> None:
    heads, truth = planted_heads()
    descriptors = lowrank_descriptors(heads, 8) if kind == "lowrank" else raw_descriptors(heads)
    grouping = group_clients(descriptors.vectors, groups=4, seed=42)
    assert adjusted_rand(grouping.labels, truth) == 1.0


def test_group_labels_are_numbered_by_first_client() -> None:
    heads, _ = planted_heads()
    labels = group_clients(raw_descriptors(heads).vectors, groups=4, seed=7).labels
    assert labels.dtype == np.int64
    assert labels[:4].tolist() == [0, 1, 2, 3]


def test_groups_are_capped_by_clients_and_distinct_points() -> None:
    assert group_clients(np.ones((1, 3)), groups=4, seed=0).centroids.shape == (1, 3)
    points = np.array([[0.0, 1.0], [0.0, 1.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        grouping = group_clients(points, groups=4, seed=0)
    assert grouping.labels.tolist() == [0, 0, 1, 1, 0]
    np.testing.assert_allclose(grouping.centroids, [[0.0, 1.0], [1.0, 0.0]])
    assert group_clients(points, groups=1, seed=0).labels.tolist() == [0] * 5


def test_soft_memberships_are_distributions_peaking_at_the_kmeans_label_hard_ones_one_hot() -> None:
    heads, _ = planted_heads(noise=0.8)
    vectors = lowrank_descriptors(heads, 8).vectors
    grouping = group_clients(vectors, groups=4, seed=1)
    memberships = soft_memberships(vectors, grouping.centroids, grouping.labels, temperature=1.0)
    assert memberships.shape == (20, 4)
    np.testing.assert_allclose(memberships.sum(axis=1), 1.0, atol=1e-12)
    assert np.array_equal(np.argmax(memberships, axis=1), grouping.labels)
    assert np.array_equal(hard_memberships(np.array([2, 0, 1, 2]), groups=3), np.eye(3)[[2, 0, 1, 2]])


def test_larger_temperature_gives_higher_membership_entropy() -> None:
    heads, _ = planted_heads(noise=0.8)
    vectors = lowrank_descriptors(heads, 8).vectors
    grouping = group_clients(vectors, groups=4, seed=1)
    entropies = [
        membership_entropy(soft_memberships(vectors, grouping.centroids, grouping.labels, tau))[0] for tau in (0.25, 1.0, 4.0)
    ]
    assert entropies[0] < entropies[1] < entropies[2]


def test_clients_on_their_centroids_get_one_hot_memberships() -> None:
    points = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    memberships = soft_memberships(points, np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([0, 0, 1]), temperature=1.0)
    np.testing.assert_allclose(memberships, np.eye(2)[[0, 0, 1]], atol=1e-12)


def test_hard_prototype_is_the_sample_weighted_average_of_members() -> None:
    prototypes = group_prototypes(ENCODERS, COUNTS, hard_memberships(np.array([0, 0, 1]), 2), soft=False)
    # group 0: (10*[1, 2] + 30*[3, 6]) / 40 = [2.5, 5]; group 1: client 2 alone
    np.testing.assert_allclose(prototypes, [[2.5, 5.0], [5.0, -1.0]], rtol=1e-7)


def test_soft_prototype_weights_clients_by_membership_times_samples() -> None:
    memberships = np.array([[0.5, 0.5], [1.0, 0.0], [0.0, 1.0]])
    prototypes = group_prototypes(ENCODERS, COUNTS, memberships, soft=True)
    # group 0: (5*[1, 2] + 30*[3, 6]) / 35; group 1: (5*[1, 2] + 60*[5, -1]) / 65
    np.testing.assert_allclose(prototypes, [[19 / 7, 38 / 7], [61 / 13, -10 / 13]], rtol=1e-6)


def test_soft_prototypes_with_one_hot_memberships_equal_hard_ones() -> None:
    one_hot = hard_memberships(np.array([1, 0, 1]), 2)
    assert np.array_equal(group_prototypes(ENCODERS, COUNTS, one_hot, soft=True), group_prototypes(ENCODERS, COUNTS, one_hot, soft=False))


def test_one_prototype_of_a_fresh_full_cache_is_the_global_encoder() -> None:
    encoders = np.random.default_rng(5).normal(size=(6, 100)).astype(np.float32)
    counts = np.array([5.0, 50.0, 17.0, 3.0, 90.0, 12.0])
    prototypes = group_prototypes(encoders, counts, np.ones((6, 1)), soft=False)
    assert np.array_equal(prototypes[0], weighted_average(encoders, counts))


def test_empty_group_falls_back_to_the_all_client_average() -> None:
    prototypes = group_prototypes(ENCODERS, COUNTS, hard_memberships(np.array([0, 0, 0]), 2), soft=False)
    assert np.array_equal(prototypes[1], weighted_average(ENCODERS, COUNTS))


def test_lambda_zero_returns_global_encoder() -> None:
    global_encoder = np.array([0.1, -0.2, 0.3], np.float32)
    prototypes = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32)
    phi = personalised_encoder(global_encoder, prototypes, np.array([0.3, 0.7]), mix=0.0)
    assert np.array_equal(phi, global_encoder)
    assert phi is not global_encoder


def test_one_hot_membership_with_lambda_one_returns_the_group_prototype() -> None:
    prototypes = np.random.default_rng(6).normal(size=(3, 50)).astype(np.float32)
    phi = personalised_encoder(np.zeros(50, np.float32), prototypes, np.array([0.0, 1.0, 0.0]), mix=1.0)
    assert np.array_equal(phi, prototypes[1])


def test_personalised_encoder_blends_global_and_mixture() -> None:
    prototypes = np.array([[2.0, 4.0], [6.0, 8.0]], np.float32)
    phi = personalised_encoder(np.array([0.0, 0.0], np.float32), prototypes, np.array([0.25, 0.75]), mix=0.5)
    # mixture = 0.25*[2, 4] + 0.75*[6, 8] = [5, 7]; phi = 0.5 * mixture
    np.testing.assert_allclose(phi, [2.5, 3.5], rtol=1e-7)
    assert phi.dtype == np.float32


def test_refresh_is_deterministic_for_a_seed() -> None:
    heads, _ = planted_heads(noise=0.8)
    encoders = np.random.default_rng(8).normal(size=(20, 30)).astype(np.float32)
    counts = np.arange(1.0, 21.0)
    first, second = (refresh_groups(heads, encoders, counts, hdcfl_params(), seed=123) for _ in range(2))
    for field in ("labels", "memberships", "prototypes", "descriptors"):
        assert np.array_equal(getattr(first, field), getattr(second, field)), field


def test_refresh_recovers_planted_groups_and_reports_silhouette() -> None:
    heads, truth = planted_heads()
    encoders = np.random.default_rng(9).normal(size=(20, 30)).astype(np.float32)
    result = refresh_groups(heads, encoders, np.ones(20), hdcfl_params(membership="hard"), seed=0)
    assert adjusted_rand(result.labels, truth) == 1.0 and result.prototypes.shape == (4, 30)
    assert np.array_equal(result.memberships, np.eye(4)[result.labels])
    assert result.effective_rank == 8 and result.silhouette > 0.5


def test_refresh_rejects_an_unknown_setting_by_name() -> None:
    heads, _ = planted_heads()
    with pytest.raises(ValueError, match="hdcfl.descriptor: 'pca'"):
        refresh_groups(heads, heads, np.ones(20), hdcfl_params(descriptor="pca"), seed=0)


def test_a_runs_refresh_seeds_kmeans_from_the_run_seed_and_the_refresh_index() -> None:
    heads, _ = planted_heads(noise=0.8)
    encoders = np.random.default_rng(10).normal(size=(20, 30)).astype(np.float32)
    counts = np.arange(1, 21)  # integer counts, as a saved cache holds them
    params = hdcfl_params(kmeans_init=1)
    for seed, refresh_index in ((7, 0), (7, 3), (42, 3)):
        kmeans_seed = seeding.int_seed(seed, "kmeans", refresh_index)
        expected = refresh_groups(heads, encoders, counts.astype(np.float64), params, seed=kmeans_seed)
        result = run_refresh(heads, encoders, counts, params, seed=seed, refresh_index=refresh_index)
        for field in ("labels", "memberships", "prototypes", "centroids"):
            assert np.array_equal(getattr(result, field), getattr(expected, field)), (seed, refresh_index, field)


def test_refresh_summary_maps_each_row_back_to_its_client_id() -> None:
    heads, _ = planted_heads()
    encoders = np.random.default_rng(11).normal(size=(20, 30)).astype(np.float32)
    result = run_refresh(heads, encoders, np.ones(20), hdcfl_params(), seed=7, refresh_index=0)
    client_ids = np.arange(100, 120)
    summary = refresh_summary(5, client_ids, result, "lowrank")
    assert summary.group_labels == {100 + i: int(label) for i, label in enumerate(result.labels)}
    assert all(np.array_equal(summary.memberships[100 + i], result.memberships[i]) for i in range(20))
    assert (summary.round_index, summary.num_groups, summary.descriptor_kind) == (5, result.prototypes.shape[0], "lowrank")
    assert summary.effective_rank == result.effective_rank and summary.silhouette == result.silhouette


def test_the_between_scale_keeps_tight_distant_groups_soft() -> None:
    """Two tight groups far apart: `within` is one-hot in all but name, `between` is not,
    and a client on its centre gives the other centre e^(-1/tau) of its weight."""
    centres = np.array([[0.0, 0.0], [10.0, 0.0]])
    points = np.array([[0.0, 0.0], [0.01, 0.0], [10.0, 0.0], [9.99, 0.0]])
    labels = np.array([0, 0, 1, 1])
    within = soft_memberships(points, centres, labels, temperature=1.0, scale="within")
    between = soft_memberships(points, centres, labels, temperature=1.0, scale="between")
    assert within[0, 1] < 1e-100
    assert np.isclose(between[0, 1] / between[0, 0], np.exp(-1.0))
    assert np.allclose(between.sum(axis=1), 1.0) and (np.argmax(between, axis=1) == labels).all()
    one_group = soft_memberships(points[:2], centres[:1], np.array([0, 0]), temperature=1.0, scale="between")
    assert np.allclose(one_group, 1.0)
    with pytest.raises(ValueError, match="temperature_scale"):
        soft_memberships(points, centres, labels, temperature=1.0, scale="across")
