"""Files that are either wholly there or not at all: written to a temporary name in
the same folder, flushed to disk (fsync), then renamed over the final name, and the
folder's entry flushed too. A process killed at any instant, or a machine that
loses power, leaves the old file or the new one, never a truncated mix."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable, BinaryIO


def fsync_directory(directory: Path) -> None:
    """Make renames and new entries in `directory` survive a power loss."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:  # some file systems do not open folders; the rename still happened
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def write_file_durably(path: Path, write: Callable[[BinaryIO], None]) -> Path:
    """Call `write(file)` on a temporary file next to `path`, fsync it, rename it to `path`."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "wb") as handle:
        write(handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    fsync_directory(path.parent)
    return path


def write_bytes_durably(path: Path, data: bytes) -> Path:
    return write_file_durably(path, lambda handle: handle.write(data))


def write_text_durably(path: Path, text: str) -> Path:
    return write_bytes_durably(path, text.encode("utf-8"))


def sha256_file(path: Path) -> str:
    """The SHA-256 of a file's bytes, read in 1 MiB blocks (checkpoints and table parts record it)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
