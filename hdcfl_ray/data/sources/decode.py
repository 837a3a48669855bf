"""Decoding encoded image files (PNG, JPEG, ...) into one preallocated uint8 array."""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from hdcfl_ray.errors import ScenarioError

ImageSource = bytes | Path


def decode_images(sources: Sequence[ImageSource], describe: Callable[[int], str]) -> np.ndarray:
    """Decode every image once into a (N, H, W, C) uint8 array.

    All images become grayscale (C = 1) when the first one is grayscale ("L"),
    else RGB (C = 3). `describe(i)` names image i in error messages (a file, a
    table row). Every image must have the size of the first.
    """
    if len(sources) == 0:
        raise ValueError("decode_images needs at least one image")
    with _open(sources, 0, describe) as first:
        mode = "L" if first.mode == "L" else "RGB"
        width, height = first.size
    channels = 1 if mode == "L" else 3
    images = np.empty((len(sources), height, width, channels), dtype=np.uint8)
    rows = images.reshape(len(sources), -1)
    # A plain loop: Pillow spends most of a small image's time in Python-level header
    # parsing, so threads only contend for the GIL and do not speed this up.
    for index in range(len(sources)):
        with _open(sources, index, describe) as image:
            if image.size != (width, height):
                raise ScenarioError(
                    f"{describe(index)} is {image.size[0]}x{image.size[1]} pixels but {describe(0)} is "
                    f"{width}x{height}; all images of a dataset must share one size (resize them first)"
                )
            try:
                pixels = image.tobytes() if image.mode == mode else image.convert(mode).tobytes()
            except OSError as error:
                raise ScenarioError(f"{describe(index)}: the image data cannot be decoded ({error})") from error
            rows[index] = memoryview(pixels)
    return images


def _open(sources: Sequence[ImageSource], index: int, describe: Callable[[int], str]) -> Image.Image:
    source = sources[index]
    try:
        return Image.open(io.BytesIO(source) if isinstance(source, bytes) else source)
    except (UnidentifiedImageError, OSError) as error:
        raise ScenarioError(f"{describe(index)}: not a readable image file ({error})") from error
