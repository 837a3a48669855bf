"""Weighted averaging: the rule behind FedAvg's global encoder and every prototype."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from hdcfl_ray.maths.aggregate import weighted_average

VECTORS = [np.array([1.0, 2.0], np.float32), np.array([3.0, 6.0], np.float32), np.array([5.0, -1.0], np.float32)]
COUNTS = [10, 30, 60]


def test_weighted_average_matches_hand_computation() -> None:
    # (10*[1, 2] + 30*[3, 6] + 60*[5, -1]) / 100 = [400, 140] / 100
    result = weighted_average(VECTORS, COUNTS)
    assert result.dtype == np.float32
    np.testing.assert_allclose(result, [4.0, 1.4], rtol=1e-7)


def test_weighted_average_matches_numpy_average() -> None:
    rng = np.random.default_rng(0)
    stacked = rng.normal(size=(7, 50)).astype(np.float32)
    weights = rng.integers(1, 500, size=7)
    expected = np.average(stacked.astype(np.float64), axis=0, weights=weights)
    np.testing.assert_allclose(weighted_average(stacked, weights), expected, rtol=1e-6, atol=1e-7)


def test_equal_weights_give_the_plain_mean() -> None:
    rng = np.random.default_rng(1)
    stacked = rng.normal(size=(5, 40)).astype(np.float32)
    np.testing.assert_allclose(weighted_average(stacked, [3.0] * 5), stacked.astype(np.float64).mean(axis=0), rtol=1e-6, atol=1e-7)


def test_weights_are_normalised() -> None:
    np.testing.assert_allclose(weighted_average(VECTORS, [1, 3, 6]), weighted_average(VECTORS, [0.1, 0.3, 0.6]), rtol=1e-7)


def test_sequence_and_stacked_input_give_the_same_bits_every_time() -> None:
    first = weighted_average(VECTORS, COUNTS)
    assert np.array_equal(first, weighted_average(np.stack(VECTORS), COUNTS))
    assert np.array_equal(first, weighted_average(VECTORS, COUNTS))


@pytest.mark.parametrize(
    ("vectors", "weights", "message"),
    [
        ([], [], "at least one vector"),
        (VECTORS, [1, 2], "3 vectors but 2 weights"),
        (VECTORS, [0, 0, 0], "positive total"),
        (VECTORS, [1, -1, 2], "non-negative"),
        ([np.zeros(2), np.zeros(3)], [1, 1], "shape"),
    ],
)
def test_bad_input_is_rejected_with_a_reason(vectors, weights, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        weighted_average(vectors, weights)


def test_hdcfl_maths_imports_before_the_algorithms_package() -> None:
    # hdcfl_ray.algorithms imports the HDC-FL algorithm, which imports hdcfl_ray.hdcfl,
    # whose prototypes use this module: importing hdcfl_ray.hdcfl first must not trip the cycle.
    command = "import hdcfl_ray.hdcfl.refresh, hdcfl_ray.hdcfl.prototypes"
    completed = subprocess.run([sys.executable, "-c", command], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
