"""What a cached choice was made from, by content rather than by name: the data the
candidates trained and were scored on, and the code that ran them.

A path names where data is, not what it holds: a Parquet folder regenerated in place
(its labels shuffled, say) must not be served the choice made on the old files. So the
cache key holds a digest of the loaded arrays themselves (images and labels of both
splits, as the run sees them after its source's own selection). Likewise a choice is
evidence about the code that ran its candidates: the key holds a digest of every
source file of the package, so an edit anywhere in the simulator makes earlier choices
miss (a version number bumped by hand would not)."""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

# blake2b is as fast as the disk here (about 1 GB/s): CIFAR-10's 150 MB of pixels in ~0.2 s
_DIGEST_BYTES = 16


def data_digest(dataset: Any) -> str:
    """A digest of a loaded dataset's arrays (train and test images and labels, their
    shapes and dtypes): equal digests mean the candidates saw the same data."""
    digest = hashlib.blake2b(digest_size=_DIGEST_BYTES)
    for name in ("train_images", "train_labels", "test_images", "test_labels"):
        array = np.ascontiguousarray(getattr(dataset, name))
        digest.update(f"{name}:{array.dtype.str}:{array.shape};".encode())
        digest.update(memoryview(array).cast("B"))
    digest.update(f"classes:{int(dataset.num_classes)}".encode())
    return digest.hexdigest()


@cache
def code_digest() -> str:
    """A digest of the package's source files (paths and contents): any change to the
    simulator's code gives another digest."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.blake2b(digest_size=_DIGEST_BYTES)
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()
