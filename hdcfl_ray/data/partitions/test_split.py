"""Per-client test sets drawn from the shared test split with the client's class proportions."""

from __future__ import annotations

import numpy as np


def indices_by_class(labels: np.ndarray, num_classes: int) -> list[np.ndarray]:
    """The indices of each class 0..num_classes-1 (of the test split, here)."""
    return [np.flatnonzero(labels == label).astype(np.int64) for label in range(num_classes)]


def allocate_test_counts(train_counts: np.ndarray, num_test: int, capacity: np.ndarray) -> np.ndarray:
    """How many test samples of each class a client gets.

    Counts follow the client's training class proportions, rounded by largest
    remainder so they sum to `num_test`; a class never exceeds `capacity` (its test
    samples), and what it cannot supply goes to the client's other classes while
    they have samples left. Classes the client does not train on get none.
    """
    counts = np.zeros_like(train_counts, dtype=np.int64)
    held = train_counts > 0
    while True:
        shortfall = num_test - int(counts.sum())
        open_classes = held & (counts < capacity)
        if shortfall <= 0 or not open_classes.any():
            return counts
        counts = np.minimum(counts + _largest_remainder(np.where(open_classes, train_counts, 0), shortfall), capacity)


def draw_client_test_indices(
    client_train_labels: np.ndarray,
    test_by_class: list[np.ndarray],
    num_test: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """Sorted test indices for one client, without repeats; other clients may draw the same ones."""
    train_counts = np.bincount(client_train_labels, minlength=len(test_by_class))
    capacity = np.array([members.shape[0] for members in test_by_class], dtype=np.int64)
    counts = allocate_test_counts(train_counts, num_test, capacity)
    drawn = [rng.choice(test_by_class[label], size=count, replace=False) for label, count in enumerate(counts) if count]
    if not drawn:
        return np.empty(0, dtype=np.int64)
    return np.sort(np.concatenate(drawn)).astype(np.int64)


def _largest_remainder(weights: np.ndarray, total: int) -> np.ndarray:
    """Integers proportional to `weights` that sum to `total`."""
    share = weights / weights.sum() * total
    counts = np.floor(share).astype(np.int64)
    leftover = total - int(counts.sum())
    counts[np.argsort(-(share - counts), kind="stable")[:leftover]] += 1
    return counts
