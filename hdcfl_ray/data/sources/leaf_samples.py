"""One LEAF user's `{"x": [...], "y": [...]}` turned into compact arrays the moment it is
parsed, and checked: FEMNIST's images (each x 784 pixels, y a class of 62) become uint8,
Shakespeare's windows (each x `dataset.sequence_length` characters, y the next one) become
character ids. What the task is (images or text) is read off the first user with a
sample; every later user must hold the same. Each refusal names the file, the user, the
sample and what to do."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from hdcfl_ray.data.sources.text import CLASSES as TEXT_CLASSES
from hdcfl_ray.data.sources.text import character_ids
from hdcfl_ray.errors import ScenarioError

FEMNIST_SIDE = 28
FEMNIST_PIXELS = FEMNIST_SIDE * FEMNIST_SIDE
# LEAF's FEMNIST classes in the order of its labels: digits, upper case, lower case
FEMNIST_CLASSES = tuple("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_REWRITE = "write the file again with LEAF's scripts, or leave this user out of it"

Task = Literal["images", "text"]


@dataclass(frozen=True)
class UserSamples:
    """A user's samples: uint8 images (n, 28, 28, 1) or character ids (n, L, 1, 1), int64
    labels, and whether its pixels came on a 0-255 scale (read as value / 255)."""

    samples: np.ndarray
    labels: np.ndarray
    rescaled: bool = False

    @property
    def count(self) -> int:
        return int(self.labels.shape[0])


class UserReader:
    """Turns each user's parsed data into `UserSamples`; remembers the task of the first
    user with a sample (text when most of its rows are strings), so a file (or folder)
    holds one task throughout."""

    def __init__(self, sequence_length: int) -> None:
        self.sequence_length = sequence_length
        self.task: Task | None = None

    @property
    def classes(self) -> tuple[str, ...]:
        """The task's classes, whatever labels the files happen to hold: FEMNIST's 62, or
        the 81 characters of the text vocabulary."""
        return TEXT_CLASSES if self.task == "text" else FEMNIST_CLASSES

    def empty_samples(self) -> np.ndarray:
        """No samples, in the shape of the task's."""
        if self.task == "text":
            return np.empty((0, self.sequence_length, 1, 1), np.uint8)
        return np.empty((0, FEMNIST_SIDE, FEMNIST_SIDE, 1), np.uint8)

    def read(self, raw: Any, file: str, user: str) -> UserSamples:
        place = f"{file}: user {user!r}"
        where = f"dataset.path: {place}"
        if not isinstance(raw, dict) or not isinstance(raw.get("x"), list) or not isinstance(raw.get("y"), list):
            raise ScenarioError(f"{where} has no x and y lists in user_data; {_REWRITE}")
        xs, ys = raw["x"], raw["y"]
        if len(xs) != len(ys):
            raise ScenarioError(f"{where} has {len(xs)} samples in x and {len(ys)} in y; {_REWRITE}")
        if self.task is None and xs:
            # by most rows, so that one corrupt first row does not set the task (and the error) for the whole file
            self.task = "text" if 2 * sum(isinstance(x, str) for x in xs) > len(xs) else "images"
        if self.task == "text":
            return _text(xs, ys, place, self.sequence_length)
        return _images(xs, ys, where)


def _images(xs: list[Any], ys: list[Any], where: str) -> UserSamples:
    if not xs:
        return UserSamples(np.empty((0, FEMNIST_SIDE, FEMNIST_SIDE, 1), np.uint8), np.empty(0, np.int64))
    lengths = [len(row) if isinstance(row, list) else -1 for row in xs]
    wrong = next((index for index, length in enumerate(lengths) if length != FEMNIST_PIXELS), None)
    if wrong is not None:
        if lengths[wrong] == -1:
            held = f"x[{wrong}] is {type(xs[wrong]).__name__}, not a list of pixels"
            if isinstance(xs[wrong], str):
                held += " (text, while the first user of the files holds images)"
        elif len(set(lengths)) > 1:
            held = f"x holds rows of different lengths (x[0]: {lengths[0]} values, x[{wrong}]: {lengths[wrong]})"
        else:
            held = f"x holds rows of {lengths[wrong]} values"
        raise ScenarioError(
            f"{where}: {held}; each of LEAF's FEMNIST images is {FEMNIST_PIXELS} values (28 x 28, in [0, 1]); {_REWRITE}"
        )
    pixels = np.asarray(xs)
    if pixels.ndim != 2 or pixels.dtype.kind not in "iuf":
        found = next(((index, value) for index, x in enumerate(xs) for value in x if not _is_number(value)), None)
        # without a value that is not a number, one is an integer too large for any array
        row, held = (found[0], f"{_shown(found[1])}, not a pixel") if found else (0, "a number too large for a pixel")
        raise ScenarioError(f"{where}: x[{row}] holds {held}; pixels are numbers in [0, 1]; {_REWRITE}")
    finite = np.isfinite(pixels)
    if not finite.all():
        row = int(np.argmin(finite.all(axis=1)))
        raise ScenarioError(
            f"{where}: x[{row}] holds {float(pixels[row][~finite[row]][0]):g} (not finite); pixels are numbers in [0, 1]; {_REWRITE}"
        )
    low, high = float(pixels.min()), float(pixels.max())
    if low < 0.0 or high > 255.0:
        outside = (pixels < 0) | (pixels > 255)
        row = int(np.argmax(outside.any(axis=1)))
        raise ScenarioError(
            f"{where}: x[{row}] holds the pixel {float(pixels[row][outside[row]][0]):g}, outside [0, 1] (LEAF's scale) "
            f"and outside [0, 255]; {_REWRITE}"
        )
    rescaled = high > 1.0  # a 0-255 scale: read as value / 255 (the caller warns, naming the file)
    images = np.rint(pixels if rescaled else pixels * 255.0).astype(np.uint8)
    return UserSamples(images.reshape(-1, FEMNIST_SIDE, FEMNIST_SIDE, 1), _femnist_labels(ys, where), rescaled)


def _femnist_labels(ys: list[Any], where: str) -> np.ndarray:
    labels = np.asarray(ys)
    integral = labels.ndim == 1 and (
        labels.dtype.kind in "iu" or (labels.dtype.kind == "f" and bool(np.all(np.isfinite(labels) & (labels == np.rint(labels)))))
    )
    # JSON's true and false are no class numbers, though numpy reads them among integers as 1 and 0
    integral = integral and not any(isinstance(y, bool) for y in ys)
    if not integral:
        index = next((index for index, y in enumerate(ys) if not (_is_number(y) and float(y).is_integer())), None)
        if index is None:  # integers too large for any array
            index = next(index for index, y in enumerate(ys) if not 0 <= y < len(FEMNIST_CLASSES))
        raise ScenarioError(
            f"{where}: y[{index}] is {_shown(ys[index])}, not a class number; FEMNIST's y is the class 0-"
            f"{len(FEMNIST_CLASSES) - 1} (digits, then upper and lower case letters); {_REWRITE}"
        )
    outside = np.flatnonzero((labels < 0) | (labels >= len(FEMNIST_CLASSES)))
    if outside.size:
        index = int(outside[0])
        raise ScenarioError(
            f"{where}: y[{index}] is {int(labels[index])}, outside FEMNIST's {len(FEMNIST_CLASSES)} classes "
            f"(0-{len(FEMNIST_CLASSES) - 1}){_more(outside.size - 1, 'of its labels')}; {_REWRITE}"
        )
    return labels.astype(np.int64)


def _text(xs: list[Any], ys: list[Any], place: str, length: int) -> UserSamples:
    wrong = next((index for index, x in enumerate(xs) if not isinstance(x, str) or len(x) != length), None)
    if wrong is not None:
        x = xs[wrong]
        held = f"{len(x)} characters" if isinstance(x, str) else f"{type(x).__name__}, not text (while the first user of the files holds text)"
        key = "dataset.sequence_length" if isinstance(x, str) else "dataset.path"
        raise ScenarioError(
            f"{key}: {place}: x[{wrong}] is {held}, and every window must be "
            f"dataset.sequence_length ({length}) characters; set dataset.sequence_length to the windows' length "
            f"(LEAF's Shakespeare: 80), or {_REWRITE}"
        )
    single = next((index for index, y in enumerate(ys) if not isinstance(y, str) or len(y) != 1), None)
    if single is not None:
        raise ScenarioError(
            f"dataset.path: {place}: y[{single}] is {_shown(ys[single])}, not one character; Shakespeare's y is the character after "
            f"its window; {_REWRITE}"
        )
    windows = character_ids("".join(xs)).reshape(len(xs), length, 1, 1) if xs else np.empty((0, length, 1, 1), np.uint8)
    return UserSamples(windows, character_ids("".join(ys)).astype(np.int64))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _more(count: int, what: str) -> str:
    """`, as are N more <what>` when there are more."""
    return f", as are {count} more {what}" if count else ""
