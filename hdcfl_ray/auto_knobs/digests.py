"""What a cached choice was made from, by content rather than by name: the data the
candidates trained and were scored on, and the code that ran them.

A path names where data is, not what it holds: a Parquet folder regenerated in place
(its labels shuffled, or its writer ids permuted among rows, say) must not be served
the choice made on the old files. So the cache key holds a digest of everything that
makes the clients, as the run sees it after its source's own selection: the loaded
arrays (images, labels and natural ids of both splits, and the id names) and the
partition itself (each client's train and test sample indices), so any change that
moves a sample to another client gives another digest. Likewise a choice is
evidence about the code that ran its candidates: the key holds a digest of every
source file of the package, so an edit anywhere in the simulator makes earlier choices
miss (a version number bumped by hand would not)."""

from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

# blake2b is as fast as the disk here (about 1 GB/s): CIFAR-10's 150 MB of pixels in ~0.2 s
_DIGEST_BYTES = 16


def data_digest(dataset: Any, partition: Any | None = None) -> str:
    """A digest of a loaded dataset's arrays (train and test images, labels and natural
    ids, their shapes and dtypes, the id names) and of `partition`'s clients (each one's
    sample indices): equal digests mean the candidates saw the same clients."""
    digest = hashlib.blake2b(digest_size=_DIGEST_BYTES)
    for name in ("train_images", "train_labels", "test_images", "test_labels"):
        _update(digest, name, getattr(dataset, name))
    for name in ("train_ids", "test_ids"):  # the column a natural partition reads (None: no ids)
        ids = getattr(dataset, name, None)
        if ids is not None:
            _update(digest, name, ids)
    digest.update(json.dumps(list(getattr(dataset, "id_names", ()))).encode())
    digest.update(f"classes:{int(dataset.num_classes)}".encode())
    if partition is not None:
        for client in partition.clients:
            digest.update(f"client:{client.client_id}:{bool(client.test_from_train)};".encode())
            _update(digest, "train_indices", client.train_indices)
            _update(digest, "test_indices", client.test_indices)
    return digest.hexdigest()


def _update(digest: Any, name: str, values: np.ndarray) -> None:
    array = np.ascontiguousarray(values)
    digest.update(f"{name}:{array.dtype.str}:{array.shape};".encode())
    digest.update(memoryview(array).cast("B"))


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
