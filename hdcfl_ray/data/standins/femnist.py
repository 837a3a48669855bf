"""A FEMNIST stand-in: handwritten characters by writer, in the layout of FEMNIST's Hugging
Face copy (flwrlabs/femnist: `image` PNG structs, `writer_id`, `character`, `hsf_id`).

The strokes are scikit-learn's digits (real handwriting, 8 x 8), drawn at 28 x 28. Each
writer has a hand: a slant, a stroke weight and a size, drawn around the style of one of a
few schools (`hsf_id`, as FEMNIST's writers come from several collections), and writes an
unequal number of characters with a skewed class mix. So clients differ as FEMNIST's
writers do, in hand and in what they wrote; there are 10 classes, not FEMNIST's 62."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

SIDE = 28
# each school: (slant in degrees, stroke weight -1 thin .. +1 bold); a writer varies around it
_SCHOOLS = ((-14.0, -0.6), (12.0, 0.7), (0.0, 0.0), (22.0, -0.2))


def _hand(rng: np.random.Generator, school: int) -> tuple[float, float, float]:
    slant, weight = _SCHOOLS[school]
    return slant + rng.normal(0.0, 4.0), float(np.clip(weight + rng.normal(0.0, 0.25), -1.0, 1.0)), rng.uniform(0.85, 1.0)


def _draw(strokes: np.ndarray, slant: float, weight: float, size: float, rng: np.random.Generator) -> np.ndarray:
    """One 8 x 8 digit (0..16) as a 28 x 28 uint8 image in this hand (white on black, as FEMNIST's inverted)."""
    image = Image.fromarray((strokes * (255.0 / 16.0)).astype(np.uint8)).resize((int(26 * size),) * 2, Image.BICUBIC)
    canvas = Image.new("L", (SIDE, SIDE))
    offset = (SIDE - image.size[0]) // 2 + int(rng.integers(-1, 2))
    canvas.paste(image, (offset, (SIDE - image.size[1]) // 2 + int(rng.integers(-1, 2))))
    shear = np.tan(np.radians(slant))
    canvas = canvas.transform((SIDE, SIDE), Image.AFFINE, (1.0, shear, -shear * SIDE / 2, 0.0, 1.0, 0.0), Image.BILINEAR)
    pixels = np.asarray(canvas, dtype=np.float32)
    if weight > 0:  # bolder: spread the ink
        pixels = np.maximum(pixels, weight * np.asarray(Image.fromarray(pixels.astype(np.uint8)).filter(_max_filter()), np.float32))
    else:  # thinner: lighter ink
        pixels = pixels * (1.0 + 0.5 * weight)
    return np.clip(pixels + rng.normal(0.0, 6.0, pixels.shape), 0, 255).astype(np.uint8)


def _max_filter():  # type: ignore[no-untyped-def]
    from PIL import ImageFilter

    return ImageFilter.MaxFilter(3)


def _png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def write_femnist_standin(out: Path, writers: int = 36, seed: int = 0, mean_samples: int = 90) -> Path:
    """Write `out/data/train-00000-of-00001.parquet` (one train split, as FEMNIST's copy has)
    and return `out`. Writers hold between about a fifth and three times `mean_samples`."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    by_class = [np.flatnonzero(digits.target == label) for label in range(10)]
    rng = np.random.default_rng(seed)
    rows: dict[str, list[object]] = {"image": [], "writer_id": [], "character": [], "hsf_id": []}
    for writer in range(writers):
        school = writer % len(_SCHOOLS)
        slant, weight, size = _hand(rng, school)
        count = int(np.clip(rng.lognormal(np.log(mean_samples), 0.6), mean_samples // 5, 3 * mean_samples))
        mix = rng.dirichlet(np.full(10, 0.8))
        for label in rng.choice(10, size=count, p=mix):
            strokes = digits.images[rng.choice(by_class[label])]
            rows["image"].append({"bytes": _png(_draw(strokes, slant, weight, size, rng)), "path": None})
            rows["writer_id"].append(f"f{writer:04d}_{school:02d}")
            rows["character"].append(int(label))
            rows["hsf_id"].append(school)
    features = {
        "image": {"_type": "Image"},
        "writer_id": {"dtype": "string", "_type": "Value"},
        "character": {"names": [str(label) for label in range(10)], "_type": "ClassLabel"},
        "hsf_id": {"dtype": "int64", "_type": "Value"},
    }
    table = pa.table(
        {
            "image": pa.array(rows["image"], pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
            "writer_id": pa.array(rows["writer_id"], pa.string()),
            "character": pa.array(rows["character"], pa.int64()),
            "hsf_id": pa.array(rows["hsf_id"], pa.int64()),
        }
    ).replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})
    (out / "data").mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out / "data" / "train-00000-of-00001.parquet", compression="zstd")
    return out
