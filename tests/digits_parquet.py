"""scikit-learn's digits as a `parquet_images` folder (train.parquet and test.parquet of
PNG bytes and labels), for the tests that write data in place and read it again."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image


def write_digits_parquet(folder: Path, shuffle_labels: bool = False, writers: int | None = None) -> Path:
    """The first 1400 digits as train.parquet, the rest as test.parquet; with
    `shuffle_labels` the labels permuted (seeded), with `writers` a `writer_id` column
    giving each row one of that many writers (seeded)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images * 16).clip(0, 255).astype(np.uint8)
    labels = digits.target.astype(np.int64)
    if shuffle_labels:
        labels = np.random.default_rng(0).permutation(labels)
    owners = None if writers is None else np.random.default_rng(1).integers(0, writers, size=len(images))
    folder.mkdir(parents=True, exist_ok=True)
    for part, rows in (("train", slice(0, 1400)), ("test", slice(1400, None))):
        encoded = []
        for image in images[rows]:
            buffer = io.BytesIO()
            Image.fromarray(image).save(buffer, format="PNG")
            encoded.append(buffer.getvalue())
        columns = {"image": encoded, "label": labels[rows]}
        if owners is not None:
            columns["writer_id"] = [f"w{owner:02d}" for owner in owners[rows]]
        pq.write_table(pa.table(columns), folder / f"{part}.parquet")
    return folder
