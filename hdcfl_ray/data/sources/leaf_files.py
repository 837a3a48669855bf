"""One LEAF JSON file read and checked as a whole: `users` names each user once, the
same users as `user_data`, `num_samples` agrees with each user's x and y, users without a
name are refused or left out (`dataset.missing_ids: drop`), and pixels on a 0-255 scale
are said. Each refusal names the file, the user and what to do."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hdcfl_ray.data.sources.leaf_json_stream import read_leaf_document
from hdcfl_ray.data.sources.leaf_samples import UserReader, UserSamples
from hdcfl_ray.data.sources.natural_ids import MissingIds, named_rows
from hdcfl_ray.errors import ScenarioError

_REWRITE = "write the file again with LEAF's scripts"


@dataclass(frozen=True)
class LeafFile:
    """A file's named users in its order, with their samples, and what reading it left
    out or changed (notices the run prints as warnings)."""

    path: Path
    users: tuple[tuple[str, UserSamples], ...]
    notices: tuple[str, ...]


def read_leaf_file(path: Path, reader: UserReader, missing_ids: MissingIds) -> LeafFile:
    document = read_leaf_document(path, lambda raw, user: reader.read(raw, str(path), user))
    missing = [name for name, absent in (("users", "users" not in document.head), ("user_data", document.user_data is None)) if absent]
    if missing:
        raise ScenarioError(
            f"dataset.path: {path} is not a LEAF data file: it has no {' and no '.join(missing)}"
            f"{' object' if missing == ['user_data'] and 'user_data' in document.head else ''} "
            "(LEAF writes users, num_samples, user_data)"
        )
    users = document.head["users"]
    data: dict[str, UserSamples] = document.user_data or {}
    if not isinstance(users, list):
        raise ScenarioError(f"dataset.path: {path}: users is not a list of user names")
    named, notices = named_rows(users, "users", str(path), missing_ids, noun="users")
    kept = list(range(len(users))) if named is None else [int(index) for index in named]
    names = [_key(users[index]) for index in kept]
    _check_listed(path, users, names, data)
    _check_counts(path, document.head.get("num_samples"), users, kept, data)
    if notices:  # the unnamed users left out: how many samples went with them
        unnamed = {_key(user) for user in users} - set(names)
        notices = tuple(f"{notice}, {sum(data[user].count for user in unnamed if user in data)} samples in all" for notice in notices)
    samples = tuple((name, data[name]) for name in names)
    rescaled = sum(user.rescaled for _, user in samples)
    if rescaled:
        notices += (
            f"dataset.path: {path}: the pixels of {rescaled} of its {len(samples)} users are on a 0-255 scale, not LEAF's "
            "[0, 1]; they were read as value / 255",
        )
    return LeafFile(path=path, users=samples, notices=notices)


def _check_listed(path: Path, users: list[Any], names: list[str], data: dict[str, UserSamples]) -> None:
    """`users` names each user once, and names the users of `user_data`."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ScenarioError(f"dataset.path: {path}: user {name!r} is listed twice in users; {_REWRITE}")
        seen.add(name)
        if name not in data:
            raise ScenarioError(f"dataset.path: {path}: user {name!r} has no x and y lists in user_data; {_REWRITE}")
    listed = {_key(user) for user in users}
    unlisted = [user for user in data if user not in listed]
    if unlisted:
        raise ScenarioError(
            f"dataset.path: {path}: user {unlisted[0]!r} has data in user_data but is not in users"
            f"{f' (nor are {len(unlisted) - 1} more)' if len(unlisted) > 1 else ''}; users and user_data must name the "
            f"same users: add them to users (and num_samples), or {_REWRITE}"
        )


def _check_counts(path: Path, counts: Any, users: list[Any], kept: list[int], data: dict[str, UserSamples]) -> None:
    """`num_samples` (when the file has it) gives each user's sample count."""
    if counts is None:
        return
    if not isinstance(counts, list) or len(counts) != len(users):
        size = f"{len(counts)} entries" if isinstance(counts, list) else type(counts).__name__
        raise ScenarioError(
            f"dataset.path: {path}: num_samples holds {size} for {len(users)} users; it gives each user's sample "
            f"count in the order of users: correct it, or {_REWRITE}"
        )
    for index in kept:
        name = _key(users[index])
        if counts[index] != data[name].count or isinstance(counts[index], bool):
            raise ScenarioError(
                f"dataset.path: {path}: user {name!r}: num_samples[{index}] says {counts[index]!r} samples, and x and y "
                f"hold {data[name].count}; the file was cut short or edited: correct num_samples[{index}], or {_REWRITE}"
            )


def _key(user: Any) -> str:
    """The key of a user's entry in `user_data` (JSON spells a None key `null`)."""
    return "null" if user is None else str(user)
