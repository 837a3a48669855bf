"""The seeded, stratified train/test split for sources that ship without a test split."""

from __future__ import annotations

import math

import numpy as np


def stratified_holdout(labels: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Split sample indices into (train, test), each sorted, with per-class test shares.

    The test split holds ceil(test_fraction * N) samples where possible, shared
    over classes by largest remainder; every class keeps at least one training
    sample so no class vanishes from training.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction}")
    rng = np.random.default_rng(seed)
    classes, class_sizes = np.unique(labels, return_counts=True)
    total_test = math.ceil(test_fraction * labels.shape[0])
    share = class_sizes / class_sizes.sum() * total_test
    test_sizes = np.floor(share).astype(np.int64)
    leftover = total_test - int(test_sizes.sum())
    test_sizes[np.argsort(-(share - test_sizes), kind="stable")[:leftover]] += 1
    test_sizes = np.minimum(test_sizes, class_sizes - 1)

    train_parts: list[np.ndarray] = []
    test_parts: list[np.ndarray] = []
    for label, test_size in zip(classes, test_sizes):
        members = rng.permutation(np.flatnonzero(labels == label))
        test_parts.append(members[:test_size])
        train_parts.append(members[test_size:])
    train = np.sort(np.concatenate(train_parts)).astype(np.int64)
    test = np.sort(np.concatenate(test_parts)).astype(np.int64)
    return train, test
