"""LEAF's JSON files (`dataset.name: leaf_json`), for those who ran LEAF's scripts: each file
holds `users` (the writer or role ids), `num_samples` and `user_data` ({user: {"x": [...],
"y": [...]}}). `dataset.path` is LEAF's data folder with `train/` and `test/` sub-folders
of JSON files (its "sample" split), or one JSON file or a folder of them (then each user
holds out `dataset.test_fraction` of its samples, seeded).

FEMNIST's x is a flattened 28 x 28 image of values in [0, 1] (a uint8 image here) and y its
class; Shakespeare's x is a string of characters and y the next one (text, as the `text`
source reads it). The kind is read off the first sample. JSON is parsed as data only."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hdcfl_ray.data.dataset import ImageDataset
from hdcfl_ray.data.sources.natural_ids import encode_ids, encode_split_ids, file_checksums, id_holdout, named_rows
from hdcfl_ray.data.sources.text import CLASSES as TEXT_CLASSES
from hdcfl_ray.data.sources.text import character_ids
from hdcfl_ray.errors import ScenarioError

if TYPE_CHECKING:
    from hdcfl_ray.config.schema import DatasetConfig


def _files(folder: Path) -> list[Path]:
    return sorted(path for path in folder.glob("*.json") if path.is_file())


def _read(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ScenarioError(f"dataset.path: {path} is not readable JSON ({error})") from None
    missing = [key for key in ("users", "user_data") if not isinstance(document, dict) or key not in document]
    if missing:
        raise ScenarioError(f"dataset.path: {path} is not a LEAF data file: it has no {' and no '.join(missing)} (LEAF writes users, num_samples, user_data)")
    return document


def _named_users(document: dict[str, Any], path: Path, config: "DatasetConfig") -> tuple[list[Any], tuple[str, ...]]:
    """The file's users with a name: a null or empty user stops the load, or (dataset.missing_ids:
    drop) is left out with its samples; the notices of the users left out."""
    users = document["users"]
    if not isinstance(users, list):
        raise ScenarioError(f"dataset.path: {path}: users is not a list of user names")
    named, notices = named_rows(users, "users", str(path), config.missing_ids, noun="users")
    if named is None:
        return users, ()
    kept = set(named.tolist())
    left_out = [users[index] for index in range(len(users)) if index not in kept]
    samples = sum(len(data.get("x") or []) for data in (document["user_data"].get(user) for user in left_out) if isinstance(data, dict))
    return [users[index] for index in named], tuple(f"{notice}, {samples} samples in all" for notice in notices)


def _samples(files: list[Path], config: "DatasetConfig") -> tuple[list[Any], list[Any], list[str], tuple[str, ...]]:
    """(x, y, the user of each sample, notices). A user without a name is refused or left
    out even when the users are not the clients: each user's holdout is drawn by them."""
    xs: list[Any] = []
    ys: list[Any] = []
    owners: list[str] = []
    notices: tuple[str, ...] = ()
    for path in files:
        document = _read(path)
        users, dropped = _named_users(document, path, config)
        notices += dropped
        for user in users:
            data = document["user_data"].get(user)
            if not isinstance(data, dict) or not isinstance(data.get("x"), list) or not isinstance(data.get("y"), list):
                raise ScenarioError(f"dataset.path: {path}: user {user!r} has no x and y lists in user_data")
            if len(data["x"]) != len(data["y"]):
                raise ScenarioError(f"dataset.path: {path}: user {user!r} has {len(data['x'])} samples in x and {len(data['y'])} in y")
            xs.extend(data["x"])
            ys.extend(data["y"])
            owners.extend([str(user)] * len(data["x"]))
    if not xs:
        raise ScenarioError(f"dataset.path: {config.path} holds no samples")
    return xs, ys, owners, notices


def _images(xs: list[Any], ys: list[Any], where: str) -> tuple[np.ndarray, np.ndarray]:
    pixels = np.asarray(xs, dtype=np.float64)
    side = int(math.isqrt(pixels.shape[1])) if pixels.ndim == 2 else 0
    if pixels.ndim != 2 or side * side != pixels.shape[1]:
        raise ScenarioError(f"dataset.path: {where}: x holds rows of {pixels.shape[1:] } values, not flattened square images")
    images = np.clip(np.rint(pixels * 255.0), 0, 255).astype(np.uint8).reshape(-1, side, side, 1)
    return images, np.asarray(ys, dtype=np.int64)


def _texts(xs: list[Any], ys: list[Any], where: str, length: int) -> tuple[np.ndarray, np.ndarray]:
    if any(len(x) != length for x in xs) or any(len(str(y)) != 1 for y in ys):
        raise ScenarioError(
            f"dataset.sequence_length: the samples of {where} are not all {length} characters with one next character; "
            "set dataset.sequence_length to their length (LEAF's Shakespeare: 80)"
        )
    samples = np.stack([character_ids(x) for x in xs]).astype(np.uint8)
    labels = np.concatenate([character_ids(str(y)) for y in ys]).astype(np.int64)
    return samples[:, :, None, None], labels


def load_leaf(config: "DatasetConfig", seed: int, id_column: str | None = None) -> ImageDataset:
    """Every user's samples; the ids (LEAF's `users`) are kept when `id_column` is `users`."""
    if id_column not in (None, "users"):
        raise ScenarioError(
            f"partition.partition_by: LEAF's files name who made each sample in users, not {id_column!r}; set "
            "partition.partition_by: users"
        )
    if config.path is None:
        raise ScenarioError("dataset.path is required when dataset.name is leaf_json: LEAF's data folder (train/ and test/) or a JSON file")
    path = Path(config.path)
    if path.is_file():
        splits = {"train": [path]}
    elif (path / "train").is_dir() and (path / "test").is_dir():
        splits = {"train": _files(path / "train"), "test": _files(path / "test")}
    elif path.is_dir():
        splits = {"train": _files(path)}
    else:
        raise ScenarioError(f"dataset.path: {path} does not exist")
    if not splits["train"]:
        raise ScenarioError(f"dataset.path: {path} holds no .json files")
    train_x, train_y, train_owners, notices = _samples(splits["train"], config)
    text = isinstance(train_x[0], str)

    def convert(xs: list[Any], ys: list[Any], where: str) -> tuple[np.ndarray, np.ndarray]:
        return _texts(xs, ys, where, config.sequence_length) if text else _images(xs, ys, where)

    train_images, train_labels = convert(train_x, train_y, str(path))
    if "test" in splits:
        test_x, test_y, test_owners, test_notices = _samples(splits["test"], config)
        notices += test_notices
        test_images, test_labels = convert(test_x, test_y, str(path / "test"))
        train_ids, test_ids, names = encode_split_ids(train_owners, test_owners, "users", str(path))
    else:
        train_ids, names = encode_ids(train_owners, "users", str(path))
        # LEAF's sample split: each user holds out test_fraction of its own samples
        train_rows, test_rows = id_holdout(train_ids, config.test_fraction, seed)
        test_images, test_labels, test_ids = train_images[test_rows], train_labels[test_rows], train_ids[test_rows]
        train_images, train_labels, train_ids = train_images[train_rows], train_labels[train_rows], train_ids[train_rows]
    classes = TEXT_CLASSES if text else tuple(str(label) for label in range(int(max(train_labels.max(), test_labels.max(initial=0))) + 1))
    kept = id_column is not None
    return ImageDataset(
        name=path.stem if path.is_file() else path.name,
        train_images=train_images,
        train_labels=train_labels,
        test_images=test_images,
        test_labels=test_labels,
        classes=classes,
        train_ids=train_ids if kept else None,
        test_ids=test_ids if kept else None,
        id_names=names if kept else (),
        text=text,
        source_files=file_checksums([file for files in splits.values() for file in files]),
        notices=notices,
    )
