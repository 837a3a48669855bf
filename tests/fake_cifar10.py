"""A tiny CIFAR-10 folder in torchvision's on-disk format, written by tests that read
it (the data sources, scripts/cifar10_to_parquet.py): nothing is downloaded."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

CLASS_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def write_torchvision_cifar10(
    root: Path, train_images: np.ndarray, train_labels: np.ndarray, test_images: np.ndarray, test_labels: np.ndarray
) -> dict[str, np.ndarray]:
    """root/cifar-10-batches-py/ as torchvision extracts it: pickled dicts with b'data'
    (N, 3072) uint8 channel-planar rows and b'labels', the training images split over
    five batches, the class names in batches.meta. Returns the arrays written."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    batch_rows = train_images.shape[0] // 5

    def dump(name: str, images: np.ndarray, labels: np.ndarray) -> None:
        rows = images.transpose(0, 3, 1, 2).reshape(images.shape[0], 3072)
        content = {b"batch_label": name.encode(), b"data": rows, b"labels": np.asarray(labels).tolist()}
        (folder / name).write_bytes(pickle.dumps(content, protocol=2))

    for number in range(1, 6):
        batch = slice((number - 1) * batch_rows, number * batch_rows)
        dump(f"data_batch_{number}", train_images[batch], train_labels[batch])
    dump("test_batch", test_images, test_labels)
    meta = {b"label_names": [name.encode() for name in CLASS_NAMES], b"num_cases_per_batch": batch_rows}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    return {"train_images": train_images, "train_labels": train_labels, "test_images": test_images, "test_labels": test_labels}
