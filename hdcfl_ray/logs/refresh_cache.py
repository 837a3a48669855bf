"""RUN_DIR/refresh_cache/: the server cache a method exports (export_cache; HDC-FL's) at each refresh round (saved when
`output.save_refresh_cache` is on), read back by `ablate` and `diagnose donor-swap`.

One `round-XXXXXX.npz` per refresh holds arrays only (read with allow_pickle=False):
round, client_ids, heads, encoders, num_samples, global_encoder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hdcfl_ray.errors import ScenarioError

DIRECTORY = "refresh_cache"


@dataclass(frozen=True)
class SavedRefresh:
    """One RUN_DIR/refresh_cache/round-XXXXXX.npz: the server cache after that round's aggregation."""

    round_index: int
    client_ids: np.ndarray  # (K_cached,)
    heads: np.ndarray  # (K_cached, Dh)
    encoders: np.ndarray  # (K_cached, De)
    num_samples: np.ndarray  # (K_cached,)
    global_encoder: np.ndarray  # (De,)


def save_refresh_cache(run_dir: Path, round_index: int, arrays: dict[str, Any] | None) -> None:
    if arrays is None:
        return
    directory = Path(run_dir) / DIRECTORY
    directory.mkdir(exist_ok=True)
    temporary = directory / f".round-{round_index:06d}.npz"
    np.savez(temporary, round=np.asarray(round_index), **arrays)
    temporary.replace(directory / f"round-{round_index:06d}.npz")


def drop_refresh_caches_after(run_dir: Path, last_round: int) -> int:
    """Remove caches saved after `last_round` (and unfinished temporary ones) when a run
    resumes from the checkpoint of that round; returns how many were removed."""
    directory = Path(run_dir) / DIRECTORY
    if not directory.is_dir():
        return 0
    removed = 0
    for path in directory.iterdir():
        stem = path.name.lstrip(".").removesuffix(".npz").removeprefix("round-")
        if path.name.startswith(".") or (stem.isdigit() and int(stem) > last_round):
            path.unlink()
            removed += 1
    return removed


def read_refresh_caches(run_dir: Path, purpose: str) -> list[SavedRefresh]:
    """The saved refreshes of a run, in round order; `purpose` names the command in errors."""
    directory = Path(run_dir) / DIRECTORY
    paths = sorted(directory.glob("round-*.npz")) if directory.is_dir() else []
    if not paths:
        raise ScenarioError(
            f"{purpose} {run_dir}: no saved refresh caches ({directory} is missing or empty); "
            f"rerun the simulation with --set output.save_refresh_cache=true"
        )
    refreshes = []
    for path in paths:
        with np.load(path, allow_pickle=False) as arrays:
            missing = [key for key in ("round", "client_ids", "heads", "encoders", "num_samples", "global_encoder") if key not in arrays.files]
            if missing:
                raise ScenarioError(f"{path}: the refresh cache lacks {', '.join(missing)}; rerun the simulation to rewrite it")
            refreshes.append(
                SavedRefresh(
                    round_index=int(arrays["round"]),
                    client_ids=np.asarray(arrays["client_ids"], dtype=np.int64),
                    heads=np.asarray(arrays["heads"]),
                    encoders=np.asarray(arrays["encoders"]),
                    num_samples=np.asarray(arrays["num_samples"]),
                    global_encoder=np.asarray(arrays["global_encoder"]),
                )
            )
    return sorted(refreshes, key=lambda refresh: refresh.round_index)
