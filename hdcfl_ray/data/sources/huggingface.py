"""Hugging Face datasets (`dataset.name: huggingface`): a dataset saved with
`save_to_disk`, a folder of Parquet shards in the Hub's layout, or (only with
`dataset.download: true`) a Hub id fetched with `datasets.load_dataset`.

Local copies are read with pyarrow alone (`datasets` is not needed to read them):
`save_to_disk` writes Arrow stream files plus JSON metadata, the Hub's shards are
Parquet. Either way an `Image` feature is a struct of encoded `bytes` and a `path`,
decoded and validated as for `parquet_images`; a `ClassLabel` feature gives the
class names. Nothing is unpickled and no dataset code is run."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hdcfl_ray.data.dataset import ImageDataset
from hdcfl_ray.data.sources.data_path import absent
from hdcfl_ray.data.sources.decode import decode_images
from hdcfl_ray.data.sources.holdout import stratified_holdout
from hdcfl_ray.data.sources.natural_ids import encode_split_ids, file_checksums, id_holdout, named_rows
from hdcfl_ray.data.sources.parquet_images import RowSelector, _encoded_images, _labels
from hdcfl_ray.errors import ScenarioError

if TYPE_CHECKING:
    from hdcfl_ray.config.schema import DatasetConfig

INSTALL_HINT = 'pip install -e ".[huggingface]"'


class _Split:
    """One split's undecoded columns, where they came from, and its features (JSON)."""

    def __init__(self, table: pa.Table, where: Path | str, features: dict[str, Any] | None, base: Path | None) -> None:
        self.table = table
        self.where = where
        self.features = features or {}
        self.base = base  # the folder image paths are relative to


def load_huggingface(
    config: "DatasetConfig",
    seed: int,
    select_train: RowSelector | None = None,
    select_test: RowSelector | None = None,
    id_column: str | None = None,
) -> ImageDataset:
    """The train and test splits named in `config`; only the selected rows are decoded.
    With `test_split: null` a seeded, stratified `test_fraction` of the train split is
    the test split (as for image folders); with an `id_column` (who made each image, e.g.
    FEMNIST's writer_id) each id holds out `test_fraction` of its own images instead."""
    if (config.path is None) == (config.hub_id is None):
        raise ScenarioError(
            "dataset.name huggingface: give either dataset.path (a folder written by save_to_disk, or of Parquet "
            "shards) or dataset.hub_id (a Hub dataset id, with dataset.download: true), not "
            + ("both" if config.path is not None else "neither")
        )
    wanted = [config.train_split] + ([config.test_split] if config.test_split is not None else [])
    if config.hub_id is not None:
        splits, name = hub_splits(config, wanted), config.hub_id
    else:
        splits, name = local_splits(Path(config.path), wanted), Path(config.path).resolve().name  # type: ignore[arg-type]
    train = splits[config.train_split]
    columns = [("dataset.image_column", config.image_column), ("dataset.label_column", config.label_column)]
    if id_column is not None:
        columns.append(("partition.partition_by", id_column))
    for key, column in columns:
        for split_name, split in splits.items():
            if column not in split.table.column_names:
                raise ScenarioError(
                    f"{key}: split {split_name!r} of {split.where} has no column {column!r}; "
                    f"its columns are: {', '.join(split.table.column_names)}"
                )
    notices = _drop_unnamed(splits, id_column, config) if id_column is not None else ()
    train_labels = _labels(train.table.column(config.label_column), Path(str(train.where)), config.label_column)
    test = train if config.test_split is None else splits[config.test_split]
    ids = None
    if id_column is not None:
        test_owners = [] if test is train else test.table.column(id_column).to_pylist()
        train_codes, test_codes, names = encode_split_ids(train.table.column(id_column).to_pylist(), test_owners, id_column, str(train.where))
        ids = (train_codes, train_codes if test is train else test_codes)
    if config.test_split is None:
        if ids is None:
            train_rows, test_rows = stratified_holdout(train_labels, config.test_fraction, seed)
        else:
            train_rows, test_rows = id_holdout(ids[0], config.test_fraction, seed)
    else:
        train_rows = np.arange(train.table.num_rows)
        test_rows = np.arange(test.table.num_rows)
    test_labels_all = _labels(test.table.column(config.label_column), Path(str(test.where)), config.label_column)
    largest = int(max(train_labels.max(), test_labels_all.max()))
    train_rows, test_rows = _select(train_rows, select_train), _select(test_rows, select_test)
    train_images, train_labels = _decode(train, config, train_rows, train_labels)
    test_images, test_labels = _decode(test, config, test_rows, test_labels_all)
    if train_images.shape[1:] != test_images.shape[1:]:
        raise ScenarioError(
            f"dataset: the train split holds images of shape {train_images.shape[1:]} but the test split "
            f"{test_images.shape[1:]}; both splits must share one image size and colour mode"
        )
    return ImageDataset(
        name=name,
        train_images=train_images,
        train_labels=train_labels,
        test_images=test_images,
        test_labels=test_labels,
        classes=_class_names(train.features, config.label_column, largest, train.where),
        train_ids=None if ids is None else ids[0][train_rows],
        test_ids=None if ids is None else ids[1][test_rows],
        id_names=() if ids is None else names,
        source_files=() if config.path is None or ids is None else file_checksums(data_files(Path(config.path))),
        notices=notices,
    )


def _drop_unnamed(splits: dict[str, _Split], id_column: str, config: "DatasetConfig") -> tuple[str, ...]:
    """Refuse the rows whose id is null or empty, or (dataset.missing_ids: drop) take them
    out of each split's table, before the holdout and the row selection see them; the
    notices of the rows left out."""
    notices: tuple[str, ...] = ()
    for split_name, split in splits.items():
        where = f"split {split_name!r} of {split.where}"
        named, dropped = named_rows(split.table.column(id_column).to_pylist(), id_column, where, config.missing_ids)
        if named is not None:
            split.table = split.table.take(pa.array(named))
        notices += dropped
    return notices


def data_files(path: Path) -> list[Path]:
    """The Arrow and Parquet files below a local copy (what its checksums cover)."""
    return [file for file in path.rglob("*") if file.is_file() and file.suffix in (".parquet", ".arrow")]


def _select(rows: np.ndarray, select: RowSelector | None) -> np.ndarray:
    keep = select(rows.shape[0]) if select is not None else None
    return rows if keep is None else rows[np.asarray(keep)]


def _decode(split: _Split, config: "DatasetConfig", rows: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if rows.shape[0] == 0:
        raise ScenarioError(f"dataset: {split.where} has no rows to use")
    column = split.table.column(config.image_column).take(pa.array(rows))
    base = split.base if split.base is not None else Path(".")
    # image paths (instead of embedded bytes) are taken relative to the split's files
    sources = _encoded_images(column, base / "split", config.image_column)
    images = decode_images(sources, lambda index: f"{split.where} row {int(rows[index])} ({config.image_column!r})")
    return images, labels[rows]


def _class_names(features: dict[str, Any], label_column: str, largest: int, where: Path | str) -> tuple[str, ...]:
    feature = features.get(label_column)
    names = feature.get("names") if isinstance(feature, dict) and feature.get("_type") == "ClassLabel" else None
    if names is None:
        return tuple(str(label) for label in range(largest + 1))
    if not isinstance(names, list) or len(names) <= largest:
        raise ScenarioError(
            f"dataset.label_column: {where}: the ClassLabel feature {label_column!r} names {len(names) if isinstance(names, list) else 0} "
            f"classes but the labels go up to {largest}"
        )
    return tuple(str(name) for name in names)


# ---- a local copy: save_to_disk, or Parquet shards ------------------------------------------------


def local_splits(path: Path, wanted: list[str]) -> dict[str, _Split]:
    if not path.is_dir():
        raise ScenarioError(
            f"dataset.path: {absent(path)}; give the folder written by save_to_disk, or a folder of "
            "Parquet shards (<split>-00000-of-00001.parquet, or <split>/*.parquet)"
        )
    if (path / "dataset_dict.json").is_file():
        available = _json(path / "dataset_dict.json").get("splits")
        if not isinstance(available, list):
            raise ScenarioError(f"dataset.path: {path / 'dataset_dict.json'} lists no splits")
        _check_splits(wanted, [str(name) for name in available], path)
        return {name: _saved_split(path / name) for name in wanted}
    if (path / "state.json").is_file():  # a single Dataset, not a DatasetDict: it is one split
        if len(wanted) > 1:
            raise ScenarioError(
                f"dataset.path: {path} holds one saved Dataset, not a DatasetDict of splits; set "
                "dataset.test_split: null to hold out dataset.test_fraction of it as the test split"
            )
        return {wanted[0]: _saved_split(path)}
    shards = _parquet_shards(path, wanted)
    if not shards:
        raise ScenarioError(
            f"dataset.path: {path} holds neither a dataset written by save_to_disk (dataset_dict.json or state.json) "
            "nor Parquet files"
        )
    _check_splits(wanted, sorted(shards), path)
    return {name: _parquet_split(shards[name], path) for name in wanted}


def _check_splits(wanted: list[str], available: list[str], where: Path | str) -> None:
    keys = ("dataset.train_split", "dataset.test_split")
    missing = [f"{keys[index]} {name!r}" for index, name in enumerate(wanted) if name not in available]
    if missing:
        raise ScenarioError(f"{', '.join(missing)}: no such split in {where}; its splits are: {', '.join(available) or 'none'}")


def _json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ScenarioError(f"dataset.path: {path} is not readable JSON ({error})") from None
    if not isinstance(value, dict):
        raise ScenarioError(f"dataset.path: {path} does not hold a JSON object")
    return value


def _saved_split(folder: Path) -> _Split:
    """One split written by save_to_disk: state.json names its Arrow stream files."""
    state = _json(folder / "state.json")
    files = [entry.get("filename") for entry in state.get("_data_files", []) if isinstance(entry, dict)]
    if not files or not all(isinstance(name, str) and "/" not in name and "\\" not in name for name in files):
        raise ScenarioError(f"dataset.path: {folder / 'state.json'} names no data files of this split")
    tables = []
    for name in files:
        try:
            with pa.memory_map(str(folder / name)) as source:
                tables.append(pa.ipc.open_stream(source).read_all())
        except (OSError, pa.ArrowException) as error:
            raise ScenarioError(f"dataset.path: {folder / name} is not a readable Arrow file ({error})") from None
    info = _json(folder / "dataset_info.json") if (folder / "dataset_info.json").is_file() else {}
    return _Split(_concat(tables, folder), folder, info.get("features"), folder)


_SHARD_NAME = re.compile(r"^(?P<split>.+?)-\d+-of-\d+\.parquet$")


def _parquet_shards(path: Path, wanted: list[str]) -> dict[str, list[Path]]:
    """Split name -> its Parquet files: `<split>.parquet` or `<split>-00000-of-00003.parquet`
    (the Hub's data/ layout) anywhere below `path`, or any Parquet file in a folder
    named after its split (`<split>/0000.parquet`)."""
    shards: dict[str, list[Path]] = {}
    for file in sorted(path.rglob("*.parquet")):
        if not file.is_file() or any(part.startswith(".") for part in file.relative_to(path).parts):
            continue
        sharded = _SHARD_NAME.match(file.name)
        stem = file.name[: -len(".parquet")]
        if sharded is not None:
            split = sharded.group("split")
        elif stem in wanted or file.parent == path:
            split = stem
        else:
            split = file.parent.name
        shards.setdefault(split, []).append(file)
    return shards


def _parquet_split(files: list[Path], root: Path) -> _Split:
    tables, features = [], None
    for file in files:
        try:
            parquet = pq.ParquetFile(file)  # not read_table: that loads pyarrow.dataset and pandas
            tables.append(parquet.read())
        except (OSError, pa.ArrowException) as error:
            raise ScenarioError(f"dataset.path: {file} is not a readable Parquet file ({error})") from None
        metadata = parquet.schema_arrow.metadata or {}
        if features is None and b"huggingface" in metadata:
            try:
                features = json.loads(metadata[b"huggingface"]).get("info", {}).get("features")
            except (ValueError, AttributeError):
                features = None
    where = files[0].parent if len(files) > 1 else files[0]
    return _Split(_concat(tables, where), where, features, files[0].parent)


def _concat(tables: list[pa.Table], where: Path | str) -> pa.Table:
    try:
        return pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    except pa.ArrowException as error:
        raise ScenarioError(f"dataset.path: the files of {where} do not share one schema ({error})") from None


# ---- the Hub ------------------------------------------------------------------------------------------


def hub_splits(config: "DatasetConfig", wanted: list[str]) -> dict[str, _Split]:
    if not config.download:
        raise ScenarioError(
            f"dataset.hub_id {config.hub_id!r}: reading from the Hugging Face Hub needs dataset.download: true "
            "(and a network); or save the dataset once (save_to_disk, or its Parquet files) and give dataset.path"
        )
    try:
        import datasets
    except ImportError:
        raise ScenarioError(f"dataset.hub_id: the datasets package is needed to download from the Hub; {INSTALL_HINT}") from None
    try:
        loaded = datasets.load_dataset(config.hub_id, name=config.hub_config)
    except Exception as error:  # no network, no such dataset, a gated dataset, a bad config name
        raise ScenarioError(f"dataset.hub_id {config.hub_id!r}: cannot be loaded ({type(error).__name__}: {error})") from None
    if not isinstance(loaded, datasets.DatasetDict):
        raise ScenarioError(f"dataset.hub_id {config.hub_id!r}: expected a dataset with named splits")
    _check_splits(wanted, list(loaded), config.hub_id or "")
    splits = {}
    for name in wanted:
        split = loaded[name]
        feature = split.features.get(config.image_column)
        if isinstance(feature, datasets.Image) and feature.decode:
            split = split.cast_column(config.image_column, datasets.Image(decode=False))  # encoded bytes, not PIL images
        table = split.with_format("arrow")[:]
        splits[name] = _Split(table, f"{config.hub_id} ({name})", split.features.to_dict(), None)
    return splits
