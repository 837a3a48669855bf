"""HDC-FL's private grouping (hdcfl_ray/hdcfl/private_grouping.py): sketches, the released
mean that centres them, and private Lloyd steps that find planted groups hidden under the
large part every head shares."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from hdcfl_ray.hdcfl.private_grouping import (
    LLOYD_STEPS_PER_REFRESH,
    SKETCH_RELEASES_PER_REFRESH,
    centred_points,
    head_sketch,
    initial_centres,
    memberships_from_centres,
    private_lloyd,
    released_grouping,
    released_sketch_mean,
    sketch_axes,
)

HEAD_LENGTH, GROUPS, PER_GROUP = 650, 4, 5


def planted_heads(seed: int, common: float = 6.0, spread: float = 0.3) -> tuple[np.ndarray, np.ndarray]:
    """Heads that share one large direction (every head has learnt the same classes) and
    differ by a smaller group direction plus client noise."""
    rng = np.random.default_rng(seed)
    shared = rng.standard_normal(HEAD_LENGTH)
    directions = rng.standard_normal((GROUPS, HEAD_LENGTH))
    labels = np.repeat(np.arange(GROUPS), PER_GROUP)
    heads = common * shared + directions[labels] + spread * rng.standard_normal((labels.size, HEAD_LENGTH))
    return heads, labels


def grouped(heads: np.ndarray, seed: int, width: int, design: str, noise: float = 0.0, refreshes: int = 6) -> np.ndarray:
    """The groups after `refreshes` refreshes on the same heads: `released` is the method's
    grouping (centred sketches, seeding, Lloyd steps); `lloyd` centres the sketches but runs
    Lloyd steps alone from the public start; `first` is the first design (no centring, Lloyd
    steps alone)."""
    axes = sketch_axes(seed, HEAD_LENGTH, width)
    sketches = np.stack([head_sketch(h, axes) for h in heads])
    rngs = iter(np.random.default_rng([seed, i]) for i in range(10_000))
    centres = initial_centres(seed, GROUPS, axes.shape[1])
    mean = np.zeros(axes.shape[1])
    for refresh in range(refreshes):
        if design == "released":
            release = released_grouping(sketches, centres, noise, 1.0, 1, seed + refresh, [next(rngs) for _ in range(SKETCH_RELEASES_PER_REFRESH)])
            mean, centres = release.mean, release.centres
            continue
        if design == "lloyd":
            mean = released_sketch_mean(sketches, noise, 1.0, next(rngs))
        points = centred_points(sketches, mean)
        steps = SKETCH_RELEASES_PER_REFRESH - 1
        centres = private_lloyd(points, centres, steps, noise, 1.0, 1, [next(rngs) for _ in range(steps)]).centres
    return memberships_from_centres(dict(enumerate(sketches)), mean, centres, "soft", 1.0).labels


def test_a_sketch_is_the_unit_heads_projection_and_never_longer_than_one() -> None:
    heads, _ = planted_heads(0)
    axes = sketch_axes(3, HEAD_LENGTH, 64)
    assert axes.shape == (HEAD_LENGTH, 64) and np.allclose(axes.T @ axes, np.eye(64), atol=1e-10)
    for head in heads:
        sketch = head_sketch(head, axes)
        assert 0.0 < np.linalg.norm(sketch) <= 1.0 + 1e-12
        assert np.allclose(sketch, axes.T @ (head / np.linalg.norm(head)))
    assert sketch_axes(3, 10, 64).shape == (10, 10)  # capped at the head's length


def test_the_released_mean_is_the_mean_sketch_without_noise_and_zero_when_nobody_sent_one() -> None:
    sketches = np.random.default_rng(1).standard_normal((7, 5)) / 4
    assert np.allclose(released_sketch_mean(sketches, 0.0, 1.0, np.random.default_rng(0)), sketches.mean(axis=0))
    assert np.array_equal(released_sketch_mean(np.zeros((0, 5)), 0.0, 1.0, np.random.default_rng(0)), np.zeros(5))
    points = centred_points(sketches, sketches.mean(axis=0))
    assert np.allclose(np.linalg.norm(points, axis=1), 1.0)


def test_the_released_mean_carries_the_noise_of_one_gaussian_release() -> None:
    sketches = np.zeros((1000, 3))
    means = np.stack([released_sketch_mean(sketches, 2.0, 0.5, np.random.default_rng(seed)) for seed in range(400)])
    # the sum's noise is 2 * sqrt(2) * 0.5 per coordinate; the count's is the same, negligible beside 1000
    assert np.std(means * 1000) == pytest.approx(2.0 * np.sqrt(2.0) * 0.5, rel=0.1)


SEEDS = range(12)


def scores(width: int, design: str, noise: float = 0.0) -> np.ndarray:
    return np.array([adjusted_rand_score(labels, grouped(heads, seed, width, design, noise)) for seed in SEEDS for heads, labels in [planted_heads(seed)]])


def test_the_released_grouping_finds_groups_hidden_under_the_shared_part() -> None:
    assert np.all(scores(64, "released") > 0.99)


def test_each_part_of_the_design_is_needed() -> None:
    """The first design (8 uncentred coordinates, Lloyd steps alone) loses the groups; centred
    wide sketches with Lloyd steps alone stop in a local optimum at some seeds (two groups
    merged, one split), which the seeding escapes."""
    first, lloyd = scores(8, "first"), scores(64, "lloyd")
    assert np.mean(first) < 0.5
    assert np.mean(lloyd) < 0.95 and np.sum(lloyd < 0.99) >= 2


def test_noise_costs_groups_gradually() -> None:
    small, large = scores(64, "released", noise=0.02), scores(64, "released", noise=1.0)
    assert np.mean(small) > 0.9 and np.mean(large) < np.mean(small)


def test_too_few_surviving_bins_fall_back_on_the_previous_centres() -> None:
    points = centred_points(np.eye(3)[:2] * 0.5, np.zeros(3))
    previous = np.arange(12, dtype=float).reshape(4, 3)
    from hdcfl_ray.hdcfl.private_grouping import seeded_centres

    assert np.array_equal(seeded_centres(points, previous, 0.0, 1.0, 1, 0, np.random.default_rng(0)), previous)


def test_the_sketch_plan_narrows_and_stops_seeding_as_the_noise_grows() -> None:
    from hdcfl_ray.hdcfl.private_grouping import MIN_SKETCH_WIDTH, sketch_plan

    noiseless = sketch_plan(64, 4, 0.0, 20)
    assert noiseless.width == 64 and noiseless.seeding
    assert sketch_plan(64, 4, 0.0, 20, head_length=30).width == 30
    plans = [sketch_plan(64, 4, sigma, 20) for sigma in (0.01, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6)]
    widths = [plan.width for plan in plans]
    assert widths == sorted(widths, reverse=True) and widths[0] == 64 and widths[-1] == MIN_SKETCH_WIDTH
    seeding = [plan.seeding for plan in plans]
    assert seeding[0] and not seeding[-1] and seeding == sorted(seeding, reverse=True)
    # more clients per group carry more noise: a wider sketch at the same sigma
    assert sketch_plan(64, 4, 0.2, 80).width > sketch_plan(64, 4, 0.2, 20).width


def test_without_seeding_the_refresh_spends_the_same_releases_on_lloyd_steps() -> None:
    heads, labels = planted_heads(3)
    axes = sketch_axes(3, HEAD_LENGTH, 16)
    sketches = np.stack([head_sketch(h, axes) for h in heads])
    rngs = [np.random.default_rng(i) for i in range(SKETCH_RELEASES_PER_REFRESH)]
    release = released_grouping(sketches, initial_centres(3, GROUPS, 16), 0.0, 1.0, 1, 0, rngs, seeding=False)
    assert release.centres.shape == (GROUPS, 16)
    with pytest.raises(ValueError, match="generators"):
        released_grouping(sketches, initial_centres(3, GROUPS, 16), 0.0, 1.0, 1, 0, rngs[:-1])
