"""Text for next-character prediction (`dataset.name: text`): Shakespeare's lines by
speaking role, and any table of text with an id column, in the Hugging Face layouts the
`huggingface` source reads (a folder written by `save_to_disk`, or of Parquet shards) or
a single Parquet file.

Each sample is `dataset.sequence_length` characters and the class is the character that
follows (LEAF's task). Two forms are read:

* windows already cut (`dataset.target_column` set, as in LEAF's and Flower's Shakespeare
  copies: `x` the characters, `y` the next one);
* raw text (`target_column` null): each row's text is cut into windows of
  `sequence_length` characters plus the next, every `stride` characters.

The vocabulary is LEAF's 80 characters (newline, space, common punctuation, digits,
letters) and one more for any other character, so a model has 81 classes. A sample is
stored as a uint8 "image" (L, 1, 1) of character ids, which the runtime carries like any
image (models/char_lstm.py reads the ids back). With `dataset.test_split: null` each id
(`partition.partition_by`) holds out `test_fraction` of its own samples as its test set
(LEAF's "sample" split); without an id column, a seeded `test_fraction` of all windows."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hdcfl_ray.data.dataset import ImageDataset
from hdcfl_ray.data.sources.huggingface import data_files, hub_splits, local_splits
from hdcfl_ray.data.sources.natural_ids import encode_ids, encode_split_ids, file_checksums, id_holdout, named_rows
from hdcfl_ray.errors import ScenarioError

if TYPE_CHECKING:
    from hdcfl_ray.config.schema import DatasetConfig

VOCABULARY = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
UNKNOWN = len(VOCABULARY)  # any character outside the vocabulary
CLASSES = (*VOCABULARY, "<other>")
_LOOKUP = np.full(0x110000, UNKNOWN, dtype=np.uint8)
_LOOKUP[[ord(char) for char in VOCABULARY]] = np.arange(len(VOCABULARY), dtype=np.uint8)


def character_ids(text: str) -> np.ndarray:
    """Each character's id in the vocabulary (UNKNOWN for any other)."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    return _LOOKUP[np.minimum(codes, 0x10FFFF)]


def _tables(config: "DatasetConfig") -> tuple[dict[str, pa.Table], list[Path]]:
    """The train (and test) tables, and the files they came from (none from the Hub)."""
    wanted = [config.train_split] + ([config.test_split] if config.test_split is not None else [])
    if config.hub_id is not None:  # only with dataset.download: true
        return {name: split.table for name, split in hub_splits(config, wanted).items()}, []
    path = Path(config.path)  # type: ignore[arg-type]
    if path.is_file():
        if config.test_split is not None:
            raise ScenarioError(
                f"dataset.path: {path} is one file, so it holds one split; set dataset.test_split: null to hold out "
                "dataset.test_fraction of each id's samples as its test set"
            )
        try:
            return {config.train_split: pq.read_table(path)}, [path]
        except (OSError, pa.ArrowInvalid) as error:
            raise ScenarioError(f"dataset.path: {path} is not a readable Parquet file ({error})") from None
    splits = local_splits(path, wanted)
    return {name: split.table for name, split in splits.items()}, data_files(path)


def _column(table: pa.Table, column: str, key: str, where: str) -> list[object]:
    if column not in table.column_names:
        raise ScenarioError(f"{key}: {where} has no column {column!r}; its columns are: {', '.join(table.column_names)}")
    values = table.column(column)
    if key != "partition.partition_by" and not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        raise ScenarioError(f"{key}: column {column!r} of {where} holds {values.type}, not text; name the column of the text")
    return values.to_pylist()


def _named_only(config: "DatasetConfig", table: pa.Table, where: str, id_column: str | None) -> tuple[pa.Table, tuple[str, ...]]:
    """The rows of `table` whose id names someone: rows with a null or empty id stop the
    load, or (dataset.missing_ids: drop) are left out before any window is cut; the
    notices of the rows left out."""
    if id_column is None:
        return table, ()
    named, notices = named_rows(_column(table, id_column, "partition.partition_by", where), id_column, where, config.missing_ids)
    return (table if named is None else table.take(pa.array(named))), notices


def _windows(
    config: "DatasetConfig", table: pa.Table, where: str, id_column: str | None
) -> tuple[np.ndarray, np.ndarray, list[object]]:
    """(samples (N, L) uint8, next-character labels (N,), the id of each sample)."""
    length = config.sequence_length
    texts = _column(table, config.text_column, "dataset.text_column", where)
    ids = _column(table, id_column, "partition.partition_by", where) if id_column is not None else [None] * len(texts)
    samples: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    owners: list[object] = []
    if config.target_column is not None:
        targets = _column(table, config.target_column, "dataset.target_column", where)
        for row, (text, target, owner) in enumerate(zip(texts, targets, ids)):
            if text is None or target is None or len(str(text)) != length or len(str(target)) != 1:
                raise ScenarioError(
                    f"dataset.sequence_length: row {row} of {where} has {len(str(text or ''))} characters in "
                    f"{config.text_column!r} and {len(str(target or ''))} in {config.target_column!r}; cut windows hold "
                    f"exactly sequence_length ({length}) characters and one next character (set dataset.sequence_length "
                    "to the windows' length, or target_column: null to cut raw text)"
                )
            samples.append(character_ids(str(text))[None])
            labels.append(character_ids(str(target)))
            owners.append(owner)
    else:
        stride = config.stride or length
        longest = 0
        for text, owner in zip(texts, ids):
            codes = character_ids(str(text or ""))
            longest = max(longest, codes.shape[0])
            starts = range(0, codes.shape[0] - length, stride)
            if len(starts):
                samples.append(np.stack([codes[start : start + length] for start in starts]))
                labels.append(np.asarray([codes[start + length] for start in starts], dtype=np.uint8))
                owners.extend([owner] * len(starts))
        if not samples:
            raise ScenarioError(
                f"dataset.sequence_length: {length} characters and the next one need rows of at least {length + 1} "
                f"characters, and the longest row of {where} ({config.text_column!r}) has {longest}; set a shorter "
                "dataset.sequence_length"
            )
    return np.concatenate(samples).astype(np.uint8), np.concatenate(labels).astype(np.int64), owners


def load_text(config: "DatasetConfig", seed: int, id_column: str | None = None) -> ImageDataset:
    """The windows of the train (and test) split; with `id_column`, who wrote or spoke each."""
    if (config.path is None) == (config.hub_id is None):
        raise ScenarioError(
            "dataset.name text: give either dataset.path (a Parquet file, or a folder in a Hugging Face layout) or "
            "dataset.hub_id (a Hub dataset id such as flwrlabs/shakespeare, with dataset.download: true), not "
            + ("both" if config.path is not None else "neither")
        )
    tables, files = _tables(config)
    source = config.path if config.path is not None else config.hub_id
    where = f"{source} ({config.train_split})"
    train_table, notices = _named_only(config, tables[config.train_split], where, id_column)
    train_samples, train_labels, train_owners = _windows(config, train_table, where, id_column)
    train_ids: np.ndarray | None
    test_ids: np.ndarray | None
    names: tuple[str, ...] = ()
    if config.test_split is None:
        if id_column is not None:
            train_ids, names = encode_ids(train_owners, id_column, where)
            train_rows, test_rows = id_holdout(train_ids, config.test_fraction, seed)
        else:
            train_ids = None
            train_rows, test_rows = id_holdout(np.zeros(train_labels.shape[0], dtype=np.int64), config.test_fraction, seed)
        test_samples, test_labels = train_samples[test_rows], train_labels[test_rows]
        test_ids = None if train_ids is None else train_ids[test_rows]
        train_samples, train_labels = train_samples[train_rows], train_labels[train_rows]
        train_ids = None if train_ids is None else train_ids[train_rows]
    else:
        test_where = f"{source} ({config.test_split})"
        test_table, test_notices = _named_only(config, tables[config.test_split], test_where, id_column)
        notices += test_notices
        test_samples, test_labels, test_owners = _windows(config, test_table, test_where, id_column)
        train_ids = test_ids = None
        if id_column is not None:
            train_ids, test_ids, names = encode_split_ids(train_owners, test_owners, id_column, where)
    return ImageDataset(
        name=Path(config.path).name if config.path is not None else str(config.hub_id),
        train_images=train_samples[:, :, None, None],
        train_labels=train_labels,
        test_images=test_samples[:, :, None, None],
        test_labels=test_labels,
        classes=CLASSES,
        train_ids=train_ids,
        test_ids=test_ids,
        id_names=names,
        text=True,
        source_files=file_checksums(files),
        notices=notices,
    )
