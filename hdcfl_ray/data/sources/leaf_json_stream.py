"""Reading one LEAF JSON file a user at a time: the top-level keys (`users`,
`num_samples`, anything else) are parsed whole, and `user_data` member by member, each
user's `{x, y}` handed to a function that makes it compact (leaf_samples) before the next
one is parsed. `json.loads` of the whole file instead holds every pixel of the file as a
Python float (32 bytes each: about 1 GB per 20,000 FEMNIST images). JSON is read as data;
nothing is executed."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Generic, TypeVar

from hdcfl_ray.errors import ScenarioError

Compact = TypeVar("Compact")

_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")


@dataclass
class LeafDocument(Generic[Compact]):
    """A file's top-level keys but `user_data` (`head`), and `user_data` made compact, in
    the file's order."""

    head: dict[str, Any] = field(default_factory=dict)
    user_data: dict[str, Compact] | None = None


def read_leaf_document(path: Path, compact: Callable[[Any, str], Compact]) -> LeafDocument[Compact]:
    """The file's members; `compact(raw, user)` turns each user's parsed data into what is
    kept. A file that is not JSON, or not a JSON object, stops with its position."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, ValueError) as error:
        raise ScenarioError(f"dataset.path: {path} is not readable JSON ({error})") from None
    try:
        return _document(text, path, compact)
    except json.JSONDecodeError as error:
        raise ScenarioError(f"dataset.path: {path} is not readable JSON ({error})") from None
    except RecursionError:
        raise ScenarioError(f"dataset.path: {path} is not a LEAF data file: it nests lists or objects too deeply") from None


def _document(text: str, path: Path, compact: Callable[[Any, str], Compact]) -> LeafDocument[Compact]:
    document: LeafDocument[Compact] = LeafDocument()
    at = _skip(text, 0)
    if not text.startswith("{", at):
        raise ScenarioError(
            f"dataset.path: {path} is not a LEAF data file: it holds no JSON object (LEAF writes users, num_samples, user_data)"
        )

    def member(key: str, at: int) -> int:
        if key == "user_data" and text.startswith("{", at):
            if document.user_data is not None:
                raise ScenarioError(f"dataset.path: {path}: user_data appears twice; write the file again with LEAF's scripts")
            kept: dict[str, Compact] = {}
            document.user_data = kept
            return _object(text, at, lambda user, start: user_entry(kept, user, start))
        value, at = _DECODER.raw_decode(text, at)
        document.head[key] = value
        return at

    def user_entry(kept: dict[str, Compact], user: str, at: int) -> int:
        if user in kept:
            raise ScenarioError(f"dataset.path: {path}: user {user!r} appears twice in user_data; write the file again with LEAF's scripts")
        raw, at = _DECODER.raw_decode(text, at)
        kept[user] = compact(raw, user)
        return at

    at = _skip(text, _object(text, at, member))
    if at != len(text):
        raise json.JSONDecodeError("Extra data", text, at)
    return document


def _object(text: str, at: int, member: Callable[[str, int], int]) -> int:
    """Walk the object at `at` (its `{`), calling `member(key, where its value starts)` for
    each member, which returns where the value ends; returns the index after the `}`."""
    at = _skip(text, at + 1)
    if text.startswith("}", at):
        return at + 1
    while True:
        if not text.startswith('"', at):
            raise json.JSONDecodeError("Expecting property name enclosed in double quotes", text, at)
        key, at = _DECODER.raw_decode(text, at)
        at = _skip(text, at)
        if not text.startswith(":", at):
            raise json.JSONDecodeError("Expecting ':' delimiter", text, at)
        at = _skip(text, member(key, _skip(text, at + 1)))
        if text.startswith(",", at):
            at = _skip(text, at + 1)
        elif text.startswith("}", at):
            return at + 1
        else:
            raise json.JSONDecodeError("Expecting ',' delimiter", text, at)


def _skip(text: str, at: int) -> int:
    match = _SPACE.match(text, at)
    return match.end() if match else at
