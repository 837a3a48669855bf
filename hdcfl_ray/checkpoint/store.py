"""Writing and reading `RUN_DIR/checkpoint/`: state.json + arrays.npz, replaced
atomically (a new folder is written, then renamed over the old one)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np

from hdcfl_ray.checkpoint.codec import Decoder, Encoder

FORMAT_VERSION = 1


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoint"


def write_checkpoint(run_dir: Path, payload: dict[str, Any], fetch: Callable[[Any], Any] | None = None) -> Path:
    encoder = Encoder(fetch=fetch)
    document = {"format": FORMAT_VERSION, "payload": encoder.encode(payload)}
    final = checkpoint_dir(run_dir)
    staging = run_dir / ".checkpoint.tmp"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    (staging / "state.json").write_text(json.dumps(document))
    np.savez(staging / "arrays.npz", **encoder.arrays)
    retired = run_dir / ".checkpoint.old"
    if retired.exists():
        shutil.rmtree(retired)
    if final.exists():
        os.replace(final, retired)
    os.replace(staging, final)
    if retired.exists():
        shutil.rmtree(retired)
    return final


def read_checkpoint(run_dir: Path, put: Callable[[Any], Any] | None = None) -> dict[str, Any] | None:
    """The saved payload, or None when the run has no checkpoint yet."""
    directory = checkpoint_dir(run_dir)
    if not (directory / "state.json").is_file():
        retired = run_dir / ".checkpoint.old"  # a crash between the two renames
        if not (retired / "state.json").is_file():
            return None
        directory = retired
    document = json.loads((directory / "state.json").read_text())
    if document.get("format") != FORMAT_VERSION:
        raise ValueError(f"{directory}: checkpoint format {document.get('format')} is not {FORMAT_VERSION}")
    with np.load(directory / "arrays.npz", allow_pickle=False) as arrays:
        return Decoder(dict(arrays), put=put).decode(document["payload"])
