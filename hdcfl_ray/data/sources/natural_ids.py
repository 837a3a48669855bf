"""The pieces natural data shares across its sources: who made each sample (an id
column: a writer, a speaking role, a user) as int codes, the per-id train/test split
(LEAF's "sample" split: each id keeps its own held-out samples) and checksums of the
files read."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from hdcfl_ray.errors import ScenarioError


def encode_ids(values: Sequence[object], column: str, where: str) -> tuple[np.ndarray, tuple[str, ...]]:
    """Int codes of the ids (in the order of their sorted names) and the names. An id
    column with a single value cannot split data into clients: refused."""
    names = np.asarray([str(value) for value in values], dtype=object)
    unique, codes = np.unique(names, return_inverse=True)
    if unique.shape[0] < 2:
        only = f"the single value {unique[0]!r}" if unique.shape[0] else "no value"
        raise ScenarioError(
            f"partition.partition_by: column {column!r} of {where} holds {only}, so it divides the data into no "
            "clients; name the column of the writer, speaker or user ids (e.g. writer_id, character_id)"
        )
    return codes.astype(np.int64), tuple(str(name) for name in unique)


def encode_split_ids(
    train_owners: Sequence[object], test_owners: Sequence[object], column: str, where: str
) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """`encode_ids` over both splits at once, so an id in both has one code: (train codes,
    test codes, names)."""
    codes, names = encode_ids([*train_owners, *test_owners], column, where)
    return codes[: len(train_owners)], codes[len(train_owners) :], names


def id_holdout(ids: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, test rows), sorted: each id holds out a seeded round(test_fraction x
    its samples) of its own samples, keeping at least one for training (an id with one
    sample keeps it)."""
    rng = np.random.default_rng(seed)
    train_parts, test_parts = [], []
    for code in np.unique(ids):
        members = rng.permutation(np.flatnonzero(ids == code))
        held = min(members.shape[0] - 1, max(1, math.floor(test_fraction * members.shape[0] + 0.5))) if members.shape[0] > 1 else 0
        test_parts.append(members[:held])
        train_parts.append(members[held:])
    return (np.sort(np.concatenate(train_parts)).astype(np.int64), np.sort(np.concatenate(test_parts)).astype(np.int64))


def file_checksums(paths: Iterable[Path]) -> tuple[tuple[str, str], ...]:
    """(path, sha256) of each file, in sorted order."""
    found = []
    for path in sorted({Path(path).resolve() for path in paths}):
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        found.append((str(path), digest.hexdigest()))
    return tuple(found)
