"""The in-memory form every data source produces: decoded uint8 images, once."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ImageDataset:
    """Train and test splits as uint8 arrays of shape (N, H, W, C) and int64 labels.

    Sources decode on the driver; the runtime places these arrays in the Ray object
    store once, and client actors read them without copies.
    """

    name: str
    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    classes: tuple[str, ...]

    def __post_init__(self) -> None:
        for split, images, labels in (
            ("train", self.train_images, self.train_labels),
            ("test", self.test_images, self.test_labels),
        ):
            if images.dtype != np.uint8 or images.ndim != 4:
                raise ValueError(f"{self.name} {split} images must be uint8 (N, H, W, C), got {images.dtype} {images.shape}")
            if labels.shape != (images.shape[0],):
                raise ValueError(f"{self.name} {split}: {images.shape[0]} images but labels of shape {labels.shape}")

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def channels(self) -> int:
        return int(self.train_images.shape[3])

    @property
    def image_size(self) -> int:
        return int(self.train_images.shape[1])
