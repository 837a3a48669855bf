"""scikit-learn's embedded 8x8 handwritten digits: no download, no files."""

from __future__ import annotations

import numpy as np

from hdcfl_ray.data.dataset import ImageDataset
from hdcfl_ray.data.sources.holdout import stratified_holdout

_MAX_INTENSITY = 16.0  # load_digits pixels are counts of set pixels in a 4x4 block


def load_digits_dataset(test_fraction: float, seed: int) -> ImageDataset:
    """All 1,797 digits as (N, 8, 8, 1) uint8; a seeded stratified `test_fraction` is the test split."""
    from sklearn.datasets import load_digits  # imported on use: sklearn is slow to import

    bunch = load_digits()
    images = np.rint(bunch.images * (255.0 / _MAX_INTENSITY)).astype(np.uint8)[..., np.newaxis]
    labels = bunch.target.astype(np.int64)
    train, test = stratified_holdout(labels, test_fraction, seed)
    return ImageDataset(
        name="digits",
        train_images=images[train],
        train_labels=labels[train],
        test_images=images[test],
        test_labels=labels[test],
        classes=tuple(str(digit) for digit in range(10)),
    )
