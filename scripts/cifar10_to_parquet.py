"""Build the CIFAR-10 Parquet folder the CPU scenarios read (`$HDCFL_CIFAR10_PARQUET`).

Reads torchvision's python-format CIFAR-10 files (`ROOT/cifar-10-batches-py/`: data_batch_1..5,
test_batch, batches.meta) and writes `OUT/train.parquet` and `OUT/test.parquet`, each with a binary
`image` column (one encoded PNG or JPEG per row) and an int16 `label` column, the class names as
JSON under the schema metadata key `classes`: the layout `dataset.name: parquet_images` reads.

    python scripts/cifar10_to_parquet.py --root data --out data/cifar10-parquet
    python scripts/cifar10_to_parquet.py --root data --out data/cifar10-parquet --download   # fetch first

The batches are read with the project's own CIFAR loader, which accepts only arrays and lists from
the pickles (never arbitrary objects); `--download` fetches and checks torchvision's archive first.
PNG (the default) keeps every pixel; `--format jpeg` writes smaller, lossy files.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from hdcfl_ray.data.sources.cifar import CIFAR10, load_cifar
from hdcfl_ray.errors import ScenarioError


def encode(image: np.ndarray, image_format: str, quality: int) -> bytes:
    """One (32, 32, 3) uint8 image as PNG or JPEG bytes."""
    buffer = io.BytesIO()
    if image_format == "png":
        Image.fromarray(image).save(buffer, format="PNG")
    else:
        Image.fromarray(image).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def write_table(path: Path, images: np.ndarray, labels: np.ndarray, classes: tuple[str, ...], image_format: str, quality: int) -> None:
    table = pa.table(
        {
            "image": pa.array([encode(image, image_format, quality) for image in images], type=pa.binary()),
            "label": pa.array(labels.astype(np.int16), type=pa.int16()),
        }
    )
    pq.write_table(table.replace_schema_metadata({"classes": json.dumps(list(classes))}), path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python scripts/cifar10_to_parquet.py",
        description="Write CIFAR-10 as train.parquet / test.parquet (encoded image bytes and labels).",
    )
    parser.add_argument("--root", type=Path, default=Path("data"), help="folder holding cifar-10-batches-py/ (default: data)")
    parser.add_argument("--out", type=Path, required=True, help="folder to write train.parquet and test.parquet into")
    parser.add_argument("--download", action="store_true", help="fetch torchvision's CIFAR-10 archive into --root first if missing")
    parser.add_argument("--format", dest="image_format", choices=("png", "jpeg"), default="png", help="image encoding (default: png, lossless)")
    parser.add_argument("--quality", type=int, default=95, help="JPEG quality, 1-95 (default: 95; ignored for png)")
    args = parser.parse_args(argv)
    if not 1 <= args.quality <= 95:
        parser.error("--quality must be between 1 and 95")
    try:
        dataset = load_cifar(CIFAR10, root=args.root, download=args.download)
    except ScenarioError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for split, images, labels in (
        ("train", dataset.train_images, dataset.train_labels),
        ("test", dataset.test_images, dataset.test_labels),
    ):
        path = args.out / f"{split}.parquet"
        write_table(path, images, labels, dataset.classes, args.image_format, args.quality)
        print(f"{path}: {len(labels)} images")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
