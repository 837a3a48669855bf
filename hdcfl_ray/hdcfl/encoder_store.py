"""Where the server keeps every client's latest encoder between refreshes.

HDC-FL builds its prototypes from the cached encoders of all K clients. With a
ResNet-18 encoder (11.2 M floats, 45 MB) and K = 1000 the cache is 45 GB, more
than a 24 GB machine holds. Two storages:

- `memory`: each entry is a zero-copy view of the upload in Ray's object store
  (the default for small models; the client's own upload can be sent back to it
  for the "local" reference score).
- `disk`: one memory-mapped file with a row per client, written as uploads
  arrive, in float32 or float16. Rows live in the page cache, which the kernel
  reclaims under pressure, so the resident cost is bounded by what the refresh
  reads at a time (`group_prototypes` reads one row after another). The file
  is unlinked as soon as it is mapped, so no run, finished or killed, leaves it
  behind.

`auto` picks disk when the full cache (K x D x 4 bytes) exceeds 4 GiB: a
function of the scenario alone, so a scenario and seed give the same results on
every machine.
"""

from __future__ import annotations

import os
import tempfile
from typing import Literal

import numpy as np

AUTO_DISK_THRESHOLD_BYTES = 4 << 30

CacheStorage = Literal["auto", "memory", "disk"]
CachePrecision = Literal["float32", "float16"]


def resolve_storage(storage: CacheStorage, num_clients: int, encoder_length: int) -> Literal["memory", "disk"]:
    """The storage `auto` stands for at this size (memory or disk)."""
    if storage != "auto":
        return storage
    return "disk" if num_clients * encoder_length * 4 > AUTO_DISK_THRESHOLD_BYTES else "memory"


class DiskEncoderStore:
    """A (num_clients, length) memory-mapped array; `put` returns the client's row view."""

    def __init__(self, num_clients: int, length: int, precision: CachePrecision = "float16", directory: str | None = None) -> None:
        if num_clients < 1 or length < 1:
            raise ValueError(f"DiskEncoderStore needs positive sizes, got {num_clients} clients x {length}")
        self.dtype = np.dtype(precision)
        if directory is not None:
            os.makedirs(directory, exist_ok=True)
        handle, path = tempfile.mkstemp(prefix="hdcfl-encoder-cache-", suffix=".bin", dir=directory)
        try:
            self.rows = np.memmap(path, dtype=self.dtype, mode="w+", shape=(num_clients, length))
        finally:
            os.close(handle)
            # The mapping keeps the file alive; its name goes now, so nothing is left on disk.
            os.unlink(path)
        self.length = length

    @property
    def nbytes(self) -> int:
        return int(self.rows.nbytes)

    def put(self, client_id: int, vector: np.ndarray) -> np.ndarray:
        flat = np.asarray(vector)
        if flat.shape != (self.length,):
            raise ValueError(f"encoder of client {client_id} has shape {flat.shape}, expected ({self.length},)")
        row = self.rows[client_id]
        row[:] = flat  # cast to the store's precision
        return row

    def __reduce__(self):  # pragma: no cover - a store never leaves its process
        raise TypeError("a DiskEncoderStore is bound to its process's memory map and cannot be pickled")
