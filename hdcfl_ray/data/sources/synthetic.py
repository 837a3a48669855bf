"""Seeded synthetic images a small CNN can learn: one blocky prototype per class plus noise."""

from __future__ import annotations

import numpy as np

from hdcfl_ray.data.dataset import ImageDataset

# Per-pixel noise (in 0..255 units) well below the typical prototype difference (~100),
# so classes stay separable while no two samples are identical.
NOISE_STD = 40.0
# Prototype detail: one random value per block of about 4x4 pixels, coarse enough
# that a few convolutions see it and that it survives interpolation.
BLOCK_PIXELS = 4


def make_synthetic(
    num_classes: int,
    image_size: int,
    channels: int,
    train_samples: int,
    test_samples: int,
    seed: int,
) -> ImageDataset:
    """Balanced classes (labels cycle through 0..K-1, then shuffled), uint8 (N, S, S, C)."""
    rng = np.random.default_rng(seed)
    grid = max(2, image_size // BLOCK_PIXELS)
    coarse = rng.uniform(0.0, 255.0, size=(num_classes, grid, grid, channels)).astype(np.float32)
    block_of_pixel = (np.arange(image_size) * grid) // image_size
    prototypes = coarse[:, block_of_pixel][:, :, block_of_pixel]

    def draw(count: int) -> tuple[np.ndarray, np.ndarray]:
        labels = rng.permutation(np.arange(count) % num_classes).astype(np.int64)
        noise = rng.standard_normal(size=(count, image_size, image_size, channels), dtype=np.float32)
        images = prototypes[labels] + NOISE_STD * noise
        return np.clip(np.rint(images), 0.0, 255.0).astype(np.uint8), labels

    train_images, train_labels = draw(train_samples)
    test_images, test_labels = draw(test_samples)
    return ImageDataset(
        name="synthetic",
        train_images=train_images,
        train_labels=train_labels,
        test_images=test_images,
        test_labels=test_labels,
        classes=tuple(f"class_{label}" for label in range(num_classes)),
    )
