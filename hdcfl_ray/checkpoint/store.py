"""Writing and reading a run's checkpoints: `RUN_DIR/checkpoint/` (the newest) and
`RUN_DIR/checkpoint.prev/` (the one before it), each `state.json` + `arrays.npz`.

A new checkpoint is written whole into a staging folder (every file fsynced, the
digest of `arrays.npz` recorded in `state.json`, which is written last), and only
then rotated in: the newest becomes the previous one, the staging folder the
newest. A crash at any moment therefore leaves at least one complete checkpoint.
Reading tries the newest first and falls back to the previous one when the newest
is damaged (a truncated or altered file), naming what was wrong."""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from hdcfl_ray.checkpoint.codec import CheckpointFormatError, Decoder, Encoder
from hdcfl_ray.durable_files import fsync_directory, sha256_file, write_bytes_durably, write_file_durably
from hdcfl_ray.errors import ScenarioError

FORMAT_VERSION = 1
NEWEST = "checkpoint"
PREVIOUS = "checkpoint.prev"
_STAGING = ".checkpoint.tmp"
_DISCARDED = ".checkpoint.discard"
_LEGACY_RETIRED = ".checkpoint.old"  # an older layout's crash state between its two renames


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / NEWEST


def write_checkpoint(
    run_dir: Path, payload: dict[str, Any], fetch: Callable[[Any], Any] | None = None, record: dict[str, Any] | None = None
) -> Path:
    """`record`: plain JSON kept beside the payload in state.json (the run's resolved
    scenario, the digests of the table parts logged so far), read without decoding."""
    encoder = Encoder(fetch=fetch)
    encoded = encoder.encode(payload)
    staging = run_dir / _STAGING
    if staging.exists():  # left by a crash while writing: incomplete by construction
        shutil.rmtree(staging)
    staging.mkdir()
    write_file_durably(staging / "arrays.npz", lambda handle: np.savez(handle, **encoder.arrays))
    document = {
        "format": FORMAT_VERSION,
        "round": payload.get("round"),
        "arrays_sha256": sha256_file(staging / "arrays.npz"),
        "payload": encoded,
        **(record or {}),
    }
    write_bytes_durably(staging / "state.json", json.dumps(document).encode("utf-8"))
    _rotate_in(run_dir, staging)
    return checkpoint_dir(run_dir)


def _rotate_in(run_dir: Path, staging: Path) -> None:
    """newest -> previous, staging -> newest; the previous one is discarded by a rename
    first, so a crash mid-delete never leaves a half-removed folder under a real name."""
    newest, previous, discarded = run_dir / NEWEST, run_dir / PREVIOUS, run_dir / _DISCARDED
    if discarded.exists():
        shutil.rmtree(discarded)
    if newest.exists():
        if previous.exists():
            os.replace(previous, discarded)
        os.replace(newest, previous)
    os.replace(staging, newest)
    fsync_directory(run_dir)
    if discarded.exists():
        shutil.rmtree(discarded)
    legacy = run_dir / _LEGACY_RETIRED
    if legacy.exists():
        shutil.rmtree(legacy)


@dataclass(frozen=True)
class DamagedCheckpoint:
    """A checkpoint folder that cannot be used, the file at fault and why."""

    directory: Path
    file: Path
    reason: str

    def describe(self) -> str:
        return f"{self.file}: {self.reason}"


@dataclass
class Checkpoint:
    """A checkpoint whose files were read and verified; `payload()` decodes it."""

    directory: Path
    round: int | None
    document: dict[str, Any]
    arrays: dict[str, np.ndarray]

    def payload(self, put: Callable[[Any], Any] | None = None) -> dict[str, Any]:
        try:
            return Decoder(self.arrays, put=put).decode(self.document["payload"])
        except (CheckpointFormatError, KeyError, TypeError, ValueError) as exc:
            raise ScenarioError(
                f"{self.directory / 'state.json'}: this checkpoint cannot be read by this version of hdcfl-ray "
                f"({type(exc).__name__}: {exc}); resume it with the version that wrote it, or start the run afresh"
            ) from None


@dataclass
class CheckpointSearch:
    """The checkpoint a resume uses (None: the run has none yet) and any passed over."""

    found: Checkpoint | None
    damaged: list[DamagedCheckpoint] = field(default_factory=list)


class CheckpointDamagedError(ScenarioError):
    """Every checkpoint of a run is damaged."""


def candidate_dirs(run_dir: Path) -> list[Path]:
    """Checkpoint folders of a run, newest first."""
    return [run_dir / name for name in (NEWEST, PREVIOUS, _LEGACY_RETIRED) if (run_dir / name).is_dir()]


def find_checkpoint(
    run_dir: Path, check: Callable[[Checkpoint], DamagedCheckpoint | None] | None = None
) -> CheckpointSearch:
    """The newest checkpoint that reads back whole (and that `check`, e.g. of the table
    parts it keeps, does not turn down). Raises CheckpointDamagedError, naming each
    file and the fix, when the run has checkpoints but none is usable."""
    damaged: list[DamagedCheckpoint] = []
    for directory in candidate_dirs(run_dir):
        verdict = _load_verified(directory)
        if isinstance(verdict, Checkpoint) and check is not None:
            verdict = check(verdict) or verdict
        if isinstance(verdict, Checkpoint):
            return CheckpointSearch(found=verdict, damaged=damaged)
        damaged.append(verdict)
    if damaged:
        listed = "; ".join(item.describe() for item in damaged)
        folders = " and ".join(str(item.directory) for item in damaged)
        raise CheckpointDamagedError(
            f"{run_dir}: no usable checkpoint ({listed}). To redo the run from round 1 in the same folder, "
            f"delete {folders} and run `hdcfl-ray simulate --resume {run_dir}` again; or start a new run with another --out"
        )
    return CheckpointSearch(found=None)


def read_checkpoint(run_dir: Path, put: Callable[[Any], Any] | None = None) -> dict[str, Any] | None:
    """The newest usable checkpoint's payload, or None when the run has no checkpoint yet."""
    search = find_checkpoint(run_dir)
    return None if search.found is None else search.found.payload(put)


def _load_verified(directory: Path) -> Checkpoint | DamagedCheckpoint:
    state_path, arrays_path = directory / "state.json", directory / "arrays.npz"
    if not state_path.is_file():
        return DamagedCheckpoint(directory, state_path, "missing")
    try:
        document = json.loads(state_path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, OSError) as exc:
        return DamagedCheckpoint(directory, state_path, f"damaged or truncated ({type(exc).__name__}: {exc})")
    if not isinstance(document, dict) or "payload" not in document:
        return DamagedCheckpoint(directory, state_path, "not a checkpoint state (no payload)")
    if document.get("format") != FORMAT_VERSION:
        return DamagedCheckpoint(directory, state_path, f"checkpoint format {document.get('format')!r} is not {FORMAT_VERSION}")
    if not arrays_path.is_file():
        return DamagedCheckpoint(directory, arrays_path, "missing")
    expected = document.get("arrays_sha256")  # absent in checkpoints written before digests were kept
    if expected is not None and sha256_file(arrays_path) != expected:
        return DamagedCheckpoint(directory, arrays_path, "damaged or truncated (its SHA-256 does not match state.json)")
    try:
        with np.load(arrays_path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as exc:
        return DamagedCheckpoint(directory, arrays_path, f"damaged or truncated ({type(exc).__name__}: {exc})")
    round_index = document.get("round")
    return Checkpoint(directory, round_index if isinstance(round_index, int) else None, document, arrays)
