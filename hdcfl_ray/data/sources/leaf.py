"""LEAF's JSON files (`dataset.name: leaf_json`), for those who ran LEAF's scripts: each file
holds `users` (the writer or role ids), `num_samples` and `user_data` ({user: {"x": [...],
"y": [...]}}). `dataset.path` is LEAF's data folder with `train/` and `test/` sub-folders
of JSON files (its "sample" split: the same users in both), or one JSON file or a folder of
them (then each user holds out `dataset.test_fraction` of its samples, seeded).

FEMNIST's x is a flattened 28 x 28 image of values in [0, 1] (a uint8 image here) and y its
class of 62; Shakespeare's x is a string of characters and y the next one (text, as the
`text` source reads it). The task is read off the first sample, and the class count is the
task's, never the largest label seen. Files are read a user at a time into compact arrays
(leaf_json_stream, leaf_samples) and checked file by file (leaf_files); a user with fewer
than 2 samples is left out, as LEAF's sample split leaves it out. JSON is parsed as data only."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hdcfl_ray.data.dataset import ImageDataset
from hdcfl_ray.data.sources.data_path import absent
from hdcfl_ray.data.sources.leaf_files import LeafFile, read_leaf_file
from hdcfl_ray.data.sources.leaf_memory import check_read_fits
from hdcfl_ray.data.sources.leaf_samples import UserReader, UserSamples
from hdcfl_ray.data.sources.natural_ids import encode_ids, encode_split_ids, file_checksums, id_holdout
from hdcfl_ray.errors import ScenarioError

if TYPE_CHECKING:
    from hdcfl_ray.config.schema import DatasetConfig

# LEAF's sample split keeps a user only with a training and a test sample
LEAF_MIN_SAMPLES = 2

Users = list[tuple[str, UserSamples, Path]]


def _files(folder: Path) -> list[Path]:
    return sorted(path for path in folder.glob("*.json") if path.is_file())


def _split_files(path: Path) -> dict[str, list[Path]]:
    if path.is_file():
        splits = {"train": [path]}
    elif (path / "train").is_dir() and (path / "test").is_dir():
        splits = {"train": _files(path / "train"), "test": _files(path / "test")}
    elif path.is_dir():
        splits = {"train": _files(path)}
    else:
        raise ScenarioError(f"dataset.path: {absent(path)}")
    if not splits["train"]:
        raise ScenarioError(f"dataset.path: {path} holds no .json files")
    if "test" in splits and not splits["test"]:
        raise ScenarioError(f"dataset.path: {path / 'test'} holds no .json files; LEAF's sample split writes one beside each in train/")
    return splits


def _users(files: list[LeafFile]) -> Users:
    return [(name, samples, file.path) for file in files for name, samples in file.users]


def _below_floor(splits: dict[str, Users], path: Path) -> tuple[dict[str, Users], tuple[str, ...]]:
    """Every split without the users that have fewer than LEAF_MIN_SAMPLES samples in all
    (its sample split cannot give such a user a training and a test sample, so LEAF
    leaves them out), and the notice of how many went."""
    totals: dict[str, int] = {}
    for users in splits.values():
        for name, samples, _ in users:
            totals[name] = totals.get(name, 0) + samples.count
    few = {name for name, total in totals.items() if total < LEAF_MIN_SAMPLES}
    if not few:
        return splits, ()
    kept = {split: [user for user in users if user[0] not in few] for split, users in splits.items()}
    notice = (
        f"dataset.path: {path}: left out {len(few)} of {len(totals)} users with fewer than {LEAF_MIN_SAMPLES} samples "
        f"({sum(totals[name] for name in few)} samples in all), as LEAF's sample split leaves them out: such a user "
        "cannot have both a training and a test sample"
    )
    return kept, (notice,)


def _check_same_users(train: Users, test: Users, path: Path) -> None:
    """LEAF's sample split writes every user to both train/ and test/; its user split
    writes each user to one of them: clients that are users would have no test samples,
    or never train."""
    train_files = {name: file for name, _, file in train}
    test_files = {name: file for name, _, file in test}
    if not train_files.keys() & test_files.keys():
        first = next(iter(test_files), None)
        example = f" (e.g. {first!r} in {test_files[first]})" if first is not None else ""
        raise ScenarioError(
            f"dataset.path: {path}: train/ and test/ hold different users: none of the {len(test_files)} users of test/ "
            f"is among the {len(train_files)} of train/{example}. This is LEAF's user split (preprocess.sh -t user), whose "
            "test users never train; it is not read here, where every client is tested on held-out samples of its own "
            "users. What works: LEAF's "
            "sample split (preprocess.sh ... -t sample), which keeps each user in both train/ and test/, or "
            "dataset.path set to LEAF's all_data folder (or one of its files), where each user holds out "
            "dataset.test_fraction of its own samples"
        )
    for here, there, other, files in (("train/", "test/", test_files, train_files), ("test/", "train/", train_files, test_files)):
        alone = [name for name in files if name not in other]
        if alone:
            raise ScenarioError(
                f"dataset.path: {path}: user {alone[0]!r} ({files[alone[0]]}) is in {here} and not in {there}"
                f"{f' ({len(alone) - 1} more users are too)' if len(alone) > 1 else ''}; LEAF's sample split writes every "
                "user to both: write train/ and test/ again in one run of LEAF's scripts (-t sample), or set dataset.path "
                "to LEAF's all_data folder, where each user holds out dataset.test_fraction of its own samples"
            )


def _joined(users: Users, reader: UserReader) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(samples, labels, the user of each sample) of a split, in the files' order."""
    if not users:
        return reader.empty_samples(), np.empty(0, np.int64), []
    samples = np.concatenate([user.samples for _, user, _ in users])
    labels = np.concatenate([user.labels for _, user, _ in users])
    owners = [name for name, user, _ in users for _ in range(user.count)]
    return samples, labels, owners


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
    split_files = _split_files(path)
    check_read_fits([file for files in split_files.values() for file in files], path)
    reader = UserReader(config.sequence_length)
    read = {split: [read_leaf_file(file, reader, config.missing_ids) for file in files] for split, files in split_files.items()}
    notices = tuple(notice for files in read.values() for file in files for notice in file.notices)
    if reader.task is None:
        raise ScenarioError(f"dataset.path: {path} holds no samples")
    splits, dropped = _below_floor({split: _users(files) for split, files in read.items()}, path)
    del read  # the users' arrays live on in `splits` only, and go as each split is joined
    notices += dropped
    if not splits["train"]:
        raise ScenarioError(f"dataset.path: {path} holds no user with {LEAF_MIN_SAMPLES} samples or more")
    if "test" in splits and id_column is not None:  # the users are the clients: each is tested on its own samples
        _check_same_users(splits["train"], splits["test"], path)
    train_samples, train_labels, train_owners = _joined(splits.pop("train"), reader)
    if "test" in splits:
        test_samples, test_labels, test_owners = _joined(splits.pop("test"), reader)
        train_ids, test_ids, names = encode_split_ids(train_owners, test_owners, "users", str(path))
    else:
        train_ids, names = encode_ids(train_owners, "users", str(path))
        # LEAF's sample split: each user holds out test_fraction of its own samples
        train_rows, test_rows = id_holdout(train_ids, config.test_fraction, seed)
        test_samples, test_labels, test_ids = train_samples[test_rows], train_labels[test_rows], train_ids[test_rows]
        train_samples, train_labels, train_ids = train_samples[train_rows], train_labels[train_rows], train_ids[train_rows]
    kept = id_column is not None
    return ImageDataset(
        name=path.stem if path.is_file() else path.name,
        train_images=train_samples,
        train_labels=train_labels,
        test_images=test_samples,
        test_labels=test_labels,
        classes=reader.classes,
        train_ids=train_ids if kept else None,
        test_ids=test_ids if kept else None,
        id_names=names if kept else (),
        text=reader.task == "text",
        source_files=file_checksums([file for files in split_files.values() for file in files]),
        notices=notices,
    )
