"""The weighted average folds large vectors on several threads, each over its own
slice; every value still goes through the same float64 operations in the same
client order, so the bits are those of one thread, whatever the thread count."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hdcfl_ray.maths import aggregate


def one_thread_reference(vectors: list[np.ndarray], weights: list[float]) -> np.ndarray:
    """The fold written out, value by value in client order."""
    scales = np.asarray(weights, dtype=np.float64) / float(np.sum(np.asarray(weights, dtype=np.float64)))
    accumulator = np.zeros(vectors[0].shape, dtype=np.float64)
    for vector, scale in zip(vectors, scales):
        accumulator = accumulator + vector.astype(np.float64) * scale
    return accumulator.astype(np.float32)


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    count=st.integers(1, 6),
    size=st.integers(1, 3 * 2**20 + 17),
    cores=st.integers(1, 16),
)
def test_every_thread_count_gives_the_one_thread_bits(seed: int, count: int, size: int, cores: int) -> None:
    rng = np.random.default_rng(seed)
    vectors = [rng.standard_normal(size).astype(np.float32) * rng.uniform(0.1, 100) for _ in range(count)]
    weights = rng.uniform(0.5, 500, size=count).round().tolist()
    original = aggregate._usable_cores
    aggregate._usable_cores = lambda: cores
    try:
        threads = len(aggregate._thread_slices(size))
        result = aggregate.weighted_average(vectors, weights)
    finally:
        aggregate._usable_cores = original
    assert threads == max(1, min(cores, size // aggregate._PER_THREAD))
    assert result.tobytes() == one_thread_reference(vectors, weights).tobytes()


def test_slices_cover_the_vector_once() -> None:
    for size in (1, 2**20, 5 * 2**20 + 3):
        slices = aggregate._thread_slices(size)
        covered = np.zeros(size, dtype=np.int64)
        for part in slices:
            covered[part] += 1
        assert (covered == 1).all()


def test_a_bad_vector_is_named_with_threads_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aggregate, "_usable_cores", lambda: 4)
    vectors = [np.zeros(3 * 2**20, dtype=np.float32), np.zeros(5, dtype=np.float32)]
    with pytest.raises(ValueError, match="vector 1 has shape"):
        aggregate.weighted_average(vectors, [1.0, 1.0])
