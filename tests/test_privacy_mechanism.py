"""hdcfl_ray/privacy: clipping, the Gaussian mechanism's private mean, and Andrew et al.'s
adaptive clip (plain numpy, no Opacus)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from hdcfl_ray.privacy.adaptive_clipping import AdaptiveClip, next_clip, noisy_unclipped_fraction, value_noise_multiplier
from hdcfl_ray.privacy.clipping import clip_parts, l2_norm
from hdcfl_ray.privacy.gaussian_sum import mean_noise_std, noised_sum, private_mean

COORDINATES = 200_000


def test_noise_on_the_mean_of_zero_updates_has_std_z_clip_over_m() -> None:
    clients, clip, z = 10, 0.5, 1.2
    zeros = [np.zeros(COORDINATES, dtype=np.float32) for _ in range(clients)]
    mean = private_mean(zeros, clip, z, clients, np.random.default_rng(0))
    assert mean.dtype == np.float32 and mean.shape == (COORDINATES,)
    assert float(np.std(mean, dtype=np.float64)) == pytest.approx(z * clip / clients, rel=0.02)


def test_a_noise_cohort_sets_the_noise_while_the_sum_is_divided_by_the_denominator() -> None:
    clients, clip, z, noise_cohort = 10, 0.5, 1.2, 1000
    assert mean_noise_std(clip, z, clients, noise_cohort) == pytest.approx(z * clip / noise_cohort)
    ones = [np.full(COORDINATES, 0.001, dtype=np.float32) for _ in range(clients)]
    mean = private_mean(ones, clip, z, clients, np.random.default_rng(1), noise_cohort_size=noise_cohort)
    assert float(np.mean(mean, dtype=np.float64)) == pytest.approx(0.001, abs=1e-5)
    assert float(np.std(mean, dtype=np.float64)) == pytest.approx(z * clip / noise_cohort, rel=0.02)


def test_one_huge_update_moves_the_mean_by_at_most_clip_over_m() -> None:
    clients, clip = 20, 1.0
    rng = np.random.default_rng(2)
    huge = rng.standard_normal(1000)
    huge *= 1000 * clip / np.linalg.norm(huge)
    clipped = [clip_parts([huge], clip)[0][0]] + [np.zeros(1000, dtype=np.float32) for _ in range(clients - 1)]
    mean = private_mean(clipped, clip, 0.0, clients, rng)
    assert l2_norm([mean]) <= clip / clients * (1 + 1e-6)


def test_zero_updates_give_the_noise_alone_when_a_size_is_given() -> None:
    alone = noised_sum([], 2.0, np.random.default_rng(3), size=5)
    assert np.array_equal(alone, (np.random.default_rng(3).standard_normal(5) * 2.0).astype(np.float32))
    with pytest.raises(ValueError, match="size"):
        noised_sum([], 2.0, np.random.default_rng(3))
    with pytest.raises(ValueError, match="length"):
        noised_sum([np.zeros(3), np.zeros(4)], 1.0, np.random.default_rng(3))


def test_the_same_seed_gives_the_same_bits() -> None:
    updates = [np.random.default_rng(seed).standard_normal(1000).astype(np.float32) for seed in range(5)]
    first = private_mean(updates, 1.0, 0.8, 5, np.random.default_rng(42))
    second = private_mean(updates, 1.0, 0.8, 5, np.random.default_rng(42))
    assert first.tobytes() == second.tobytes()
    norms = [0.5, 1.5, 2.5]
    assert noisy_unclipped_fraction(norms, 1.0, 0.3, 3, np.random.default_rng(7)) == noisy_unclipped_fraction(
        norms, 1.0, 0.3, 3, np.random.default_rng(7)
    )


def test_clipping_keeps_the_direction_and_shapes_of_a_long_update() -> None:
    rng = np.random.default_rng(4)
    parts = [rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal(7).astype(np.float32)]
    clipped, norm = clip_parts(parts, 0.1)
    assert norm == pytest.approx(l2_norm(parts)) and norm > 0.1
    assert [part.shape for part in clipped] == [(3, 4), (7,)] and all(part.dtype == np.float32 for part in clipped)
    for before, after in zip(parts, clipped):
        np.testing.assert_allclose(after, before * (0.1 / norm), rtol=1e-6)
    assert l2_norm(clipped) == pytest.approx(0.1, rel=1e-6)


def test_clipping_leaves_an_update_within_the_clip_bit_for_bit() -> None:
    rng = np.random.default_rng(5)
    parts = [rng.standard_normal(50).astype(np.float32) * 0.01, np.zeros((2, 2), dtype=np.float32)]
    clipped, _ = clip_parts(parts, 10.0)
    assert [part.tobytes() for part in clipped] == [part.tobytes() for part in parts]
    assert all(after is not before for before, after in zip(parts, clipped))  # copies, not the caller's arrays
    zeros, norm = clip_parts([np.zeros(4, dtype=np.float32)], 1.0)
    assert norm == 0.0 and not zeros[0].any()


def test_clipping_refuses_a_clip_that_is_not_a_positive_norm() -> None:
    for clip in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="clip"):
            clip_parts([np.ones(3)], clip)


@settings(max_examples=200, deadline=None)
@given(
    parts=st.lists(arrays(np.float32, st.integers(0, 30), elements=st.floats(-1e4, 1e4, width=32)), min_size=1, max_size=4),
    clip=st.floats(1e-3, 1e3),
)
def test_clipping_never_lengthens_an_update_nor_exceeds_the_clip(parts: list[np.ndarray], clip: float) -> None:
    clipped, norm = clip_parts(parts, clip)
    after = l2_norm(clipped)
    assert after <= clip * (1 + 1e-6)
    assert after <= norm * (1 + 1e-6)
    assert norm == pytest.approx(float(np.linalg.norm(np.concatenate([p.ravel() for p in parts]).astype(np.float64))))


@pytest.mark.parametrize("target_quantile", [0.5, 0.9])
def test_adaptive_clip_converges_to_the_target_quantile_of_the_update_norms(target_quantile: float) -> None:
    rng = np.random.default_rng(6)
    norms = rng.lognormal(mean=0.0, sigma=1.0, size=100)
    state = AdaptiveClip(clip=0.05, target_quantile=target_quantile, count_noise_multiplier=0.5)
    for _ in range(200):
        fraction = noisy_unclipped_fraction(norms, state.clip, state.count_noise_multiplier, len(norms), rng)
        state = dataclasses.replace(state, clip=next_clip(state, fraction))
    assert abs(float(np.mean(norms <= state.clip)) - target_quantile) <= 0.05


def test_the_clip_shrinks_when_more_than_the_target_quantile_went_unclipped() -> None:
    state = AdaptiveClip(clip=1.0, target_quantile=0.5, learning_rate=0.2, count_noise_multiplier=1.0)
    assert next_clip(state, 0.9) == pytest.approx(np.exp(-0.2 * 0.4)) and next_clip(state, 0.9) < 1.0
    assert next_clip(state, 0.1) > 1.0
    assert next_clip(state, 0.5) == 1.0


def test_adaptive_clip_state_is_plain_floats_for_a_json_checkpoint() -> None:
    state = AdaptiveClip(clip=np.float32(0.75), count_noise_multiplier=np.float64(5.0), target_quantile=1)
    saved = dataclasses.asdict(state)
    assert all(type(value) is float for value in saved.values())
    assert AdaptiveClip(**json.loads(json.dumps(saved))) == state
    with pytest.raises(ValueError, match="target_quantile"):
        AdaptiveClip(clip=1.0, target_quantile=1.5, count_noise_multiplier=1.0)


def test_value_noise_multiplier_splits_the_budget_as_theorem_1_says() -> None:
    z, sigma_b = 1.0, 5.0
    z_value = value_noise_multiplier(z, sigma_b)
    assert z_value == pytest.approx((z**-2 - (2 * sigma_b) ** -2) ** -0.5)
    assert z_value**-2 + (2 * sigma_b) ** -2 == pytest.approx(z**-2)
    assert z_value > z


@pytest.mark.parametrize("sigma_b", [0.0, 0.4, 0.5])
def test_value_noise_multiplier_refuses_a_count_noise_too_small(sigma_b: float) -> None:
    with pytest.raises(ValueError, match="count noise multiplier .* too small"):
        value_noise_multiplier(1.0, sigma_b)
