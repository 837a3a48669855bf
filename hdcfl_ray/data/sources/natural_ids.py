"""The pieces natural data shares across its sources: who made each sample (an id
column: a writer, a speaking role, a user) as int codes, the rows whose id names no one
(refused, or left out with `dataset.missing_ids: drop`), the per-id train/test split
(LEAF's "sample" split: each id keeps its own held-out samples) and checksums of the
files read."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Iterable, Literal, Sequence

import numpy as np

from hdcfl_ray.errors import ScenarioError


MissingIds = Literal["error", "drop"]


def unnamed_ids(values: Sequence[object]) -> tuple[np.ndarray, np.ndarray]:
    """(null, blank): masks of the ids that name no one. Null is None or NaN (pyarrow's
    and pandas' missing values), blank a text of nothing or only whitespace. Read as
    names, each would gather the rows of many people into one client ("None", "nan", "")."""
    null = np.fromiter((_is_null(value) for value in values), dtype=bool, count=len(values))
    blank = np.fromiter((isinstance(value, (str, bytes)) and not value.strip() for value in values), dtype=bool, count=len(values))
    return null, blank


def _is_null(value: object) -> bool:
    return value is None or (isinstance(value, (float, np.floating)) and bool(np.isnan(value)))


def named_rows(
    values: Sequence[object], column: str, where: str, missing_ids: MissingIds, noun: str = "rows"
) -> tuple[np.ndarray | None, tuple[str, ...]]:
    """The rows whose id names someone (None: every row) and the notice of the rows left
    out. Rows without an id stop the load, naming `column`, `where` and the count, unless
    `missing_ids` is "drop"; `noun` says what a row is (rows, users)."""
    null, blank = unnamed_ids(values)
    unnamed = null | blank
    missing = int(unnamed.sum())
    if missing == 0:
        return None, ()
    kinds = ", ".join(part for part in (f"{int(null.sum())} null" if null.any() else "", f"{int(blank.sum())} empty" if blank.any() else "") if part)
    counted = f"{missing} of {len(values)} {noun} ({kinds}; the first is {noun[:-1]} {int(np.argmax(unnamed))})"
    if missing_ids == "error" or missing == len(values):
        fix = (
            "fill in the ids, or set dataset.missing_ids: drop to leave those rows out"
            if missing < len(values)
            else "name the column of the writer, speaker or user ids (e.g. writer_id, character_id)"
        )
        raise ScenarioError(
            f"partition.partition_by: column {column!r} of {where} has no id in {counted}: read as names they would make "
            f"one client of the samples of many people; {fix}"
        )
    return np.flatnonzero(~unnamed), (f"dataset.missing_ids: drop: left out the {counted} of {where} that have no id in column {column!r}",)


def encode_ids(values: Sequence[object], column: str, where: str) -> tuple[np.ndarray, tuple[str, ...]]:
    """Int codes of the ids (in the order of their sorted names) and the names. An id
    column with a single value cannot split data into clients: refused; so is a null or
    empty id (the sources leave those out first with `dataset.missing_ids: drop`)."""
    named_rows(values, column, where, "error")
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
