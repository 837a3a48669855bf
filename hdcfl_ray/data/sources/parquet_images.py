"""Image tables in the Hugging Face Parquet layout: an encoded-image column and an integer label column."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hdcfl_ray.data.dataset import ImageDataset
from hdcfl_ray.data.sources.data_path import absent
from hdcfl_ray.data.sources.decode import ImageSource, decode_images
from hdcfl_ray.data.sources.natural_ids import MissingIds, encode_split_ids, file_checksums, named_rows
from hdcfl_ray.errors import ScenarioError

CLASSES_METADATA_KEY = b"classes"
# The most classes a table may have (labels 0..MAX_CLASSES-1) when its schema does not
# name them: a stray label of 2,000,000,000 would otherwise mean as many class names.
MAX_CLASSES = 100_000

RowSelector = Callable[[int], "np.ndarray | None"]


def load_parquet_images(
    path: str | Path,
    image_column: str = "image",
    label_column: str = "label",
    train_file: str = "train.parquet",
    test_file: str = "test.parquet",
    select_train: RowSelector | None = None,
    select_test: RowSelector | None = None,
    id_column: str | None = None,
    missing_ids: MissingIds = "error",
) -> ImageDataset:
    """Decode a train and a test table, found from a folder or from the train file itself.

    `path` is a folder holding `train_file` and `test_file`, or the train file, whose
    test table is the sibling named like it with "train" replaced by "test", else `test_file`.
    Class names come from the schema metadata key `classes` (a JSON list) when present.
    `select_train(num_rows)` / `select_test(num_rows)` may return the row indices to keep
    (None keeps all): only those rows are decoded, so a subset of a large table is cheap.
    `id_column`: the column of who made each image (FEMNIST's writer_id), read as the ids;
    rows where it is null or empty stop the load, or are left out first with
    `missing_ids="drop"` (the dataset's notices say how many).
    """
    train_path, test_path = _locate_tables(Path(path), train_file, test_file)
    train = _read_table(train_path, image_column, label_column, select_train, id_column, missing_ids)
    test = _read_table(test_path, image_column, label_column, select_test, id_column, missing_ids)
    train_images, train_labels, train_owners = train.images, train.labels, train.owners
    test_images, test_labels, test_owners = test.images, test.labels, test.owners
    ids: dict[str, object] = {}
    if id_column is not None:
        train_ids, test_ids, names = encode_split_ids(train_owners, test_owners, id_column, str(train_path))
        ids = {"train_ids": train_ids, "test_ids": test_ids, "id_names": names}
    if train_images.shape[1:] != test_images.shape[1:]:
        raise ScenarioError(
            f"dataset.path: {train_path} holds images of shape {train_images.shape[1:]} but {test_path} "
            f"holds {test_images.shape[1:]}; both splits must share one image size and colour mode"
        )
    largest_label = max(train.largest_label, test.largest_label)
    classes = _class_names(train.schema, train_path, largest_label)
    return ImageDataset(
        name=(train_path.parent.name or "parquet_images"),
        train_images=train_images,
        train_labels=train_labels,
        test_images=test_images,
        test_labels=test_labels,
        classes=classes,
        source_files=file_checksums([train_path, test_path]) if id_column is not None else (),  # natural data's manifest
        notices=train.notices + test.notices,
        **ids,  # type: ignore[arg-type]
    )


def _locate_tables(path: Path, train_file: str, test_file: str) -> tuple[Path, Path]:
    if path.is_dir():
        train_path, test_candidates = path / train_file, [path / test_file]
    elif path.is_file():
        train_path = path
        test_candidates = [path.with_name(path.name.replace("train", "test"))] if "train" in path.name else []
        test_candidates.append(path.with_name(test_file))
    else:
        raise ScenarioError(
            f"dataset.path: {absent(path)}; expected a folder holding {train_file} and "
            f"{test_file} (dataset.train_file / dataset.test_file), or the train Parquet file itself"
        )
    if not train_path.is_file():
        raise ScenarioError(
            f"dataset.path: no {train_file} in {path}; expected the train table there "
            f"(or set dataset.train_file to its name)"
        )
    for candidate in test_candidates:
        if candidate != train_path and candidate.is_file():
            return train_path, candidate
    tried = ", ".join(str(candidate) for candidate in test_candidates if candidate != train_path)
    raise ScenarioError(
        f"dataset.path: no test table next to {train_path} (tried {tried}); put it there "
        f"or set dataset.test_file to its name"
    )


def _schema(path: Path) -> pa.Schema:
    try:
        return pq.read_schema(path)
    except (pa.ArrowException, OSError) as error:
        raise ScenarioError(f"dataset.path: {path} is not a readable Parquet file ({error})") from error


class _Table(NamedTuple):
    """One table's selected rows, decoded."""

    images: np.ndarray
    labels: np.ndarray
    largest_label: int  # of the whole table
    schema: pa.Schema
    owners: list[object]  # the ids, or []
    notices: tuple[str, ...]  # the rows without an id left out


def _read_table(
    path: Path,
    image_column: str,
    label_column: str,
    select: RowSelector | None,
    id_column: str | None = None,
    missing_ids: MissingIds = "error",
) -> _Table:
    """The selected rows of the table at `path`, decoded; rows without an id are refused,
    or left out before the selection (`missing_ids="drop"`)."""
    schema = _schema(path)
    present = ", ".join(schema.names)
    columns = [("dataset.image_column", image_column), ("dataset.label_column", label_column)]
    if id_column is not None:
        columns.append(("partition.partition_by", id_column))
    for key, column in columns:
        if column not in schema.names:
            raise ScenarioError(f"{key}: {path} has no column {column!r}; its columns are: {present}")
    # ParquetFile.read, not read_table: the latter loads pyarrow.dataset and with it pandas (~0.1 GB).
    table = pq.ParquetFile(path).read(columns=[column for _, column in columns])
    if table.num_rows == 0:
        raise ScenarioError(f"dataset.path: {path} has no rows")
    notices: tuple[str, ...] = ()
    if id_column is not None:  # before the row selection, so it picks among the rows that are kept
        named, notices = named_rows(table.column(id_column).to_pylist(), id_column, str(path), missing_ids)
        table = table if named is None else table.take(pa.array(named))
    labels = _labels(table.column(label_column), path, label_column)
    # The class count comes from the whole table, so a small subset keeps every class index.
    largest_label = int(labels.max())
    keep = select(table.num_rows) if select is not None else None
    rows = np.arange(table.num_rows) if keep is None else np.asarray(keep)
    if keep is not None:
        table = table.take(pa.array(rows))
        labels = labels[rows]
    sources = _encoded_images(table.column(image_column), path, image_column)
    images = decode_images(sources, lambda index: f"{path} row {int(rows[index])} ({image_column!r})")
    owners = table.column(id_column).to_pylist() if id_column is not None else []
    return _Table(images, labels, largest_label, schema, owners, notices)


def _labels(column: pa.ChunkedArray, path: Path, name: str) -> np.ndarray:
    if not pa.types.is_integer(column.type):
        raise ScenarioError(f"dataset.label_column: column {name!r} of {path} holds {column.type}, not integer labels")
    if column.null_count:
        raise ScenarioError(f"dataset.label_column: column {name!r} of {path} has {column.null_count} missing labels")
    labels = column.to_numpy().astype(np.int64)
    if labels.min() < 0:
        raise ScenarioError(f"dataset.label_column: column {name!r} of {path} has negative labels; use 0..C-1")
    largest = int(labels.max())
    if largest >= MAX_CLASSES:
        row = int(np.argmax(labels))
        raise ScenarioError(
            f"dataset.label_column: column {name!r} of {path} has the label {largest} (row {row}); labels are class "
            f"indices 0..C-1, and at most {MAX_CLASSES} classes are supported"
        )
    return labels


def _encoded_images(column: pa.ChunkedArray, path: Path, name: str) -> list[ImageSource]:
    kind = column.type
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        blobs: list[bytes | None] = column.to_pylist()
        image_paths: list[str | None] = [None] * len(blobs)
    elif pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0:
        combined = column.combine_chunks()
        blobs = combined.field("bytes").to_pylist()
        has_paths = kind.get_field_index("path") >= 0
        image_paths = combined.field("path").to_pylist() if has_paths else [None] * len(blobs)
    else:
        raise ScenarioError(
            f"dataset.image_column: column {name!r} of {path} holds {kind}; expected encoded image "
            f"bytes (binary) or a struct with a 'bytes' field"
        )
    sources: list[ImageSource] = []
    for row, (blob, image_path) in enumerate(zip(blobs, image_paths)):
        if blob is not None:
            sources.append(blob)
        elif image_path is not None:
            # Tables that reference images instead of embedding them use paths relative to the table.
            sources.append(path.parent / image_path)
        else:
            raise ScenarioError(f"dataset.image_column: {path} row {row} has no image bytes and no path")
    return sources


def _class_names(schema: pa.Schema, path: Path, largest_label: int) -> tuple[str, ...]:
    metadata = schema.metadata or {}
    if CLASSES_METADATA_KEY not in metadata:
        return tuple(str(label) for label in range(largest_label + 1))
    try:
        names = json.loads(metadata[CLASSES_METADATA_KEY])
    except json.JSONDecodeError as error:
        raise ScenarioError(f"dataset.path: {path}: schema metadata 'classes' is not JSON ({error})") from error
    if not isinstance(names, list) or len(names) <= largest_label:
        raise ScenarioError(
            f"dataset.path: {path}: schema metadata 'classes' must be a JSON list naming labels "
            f"0..{largest_label}; it holds {names!r:.200}"
        )
    return tuple(str(name) for name in names)
