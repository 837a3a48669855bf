"""Decoding encoded image files (PNG, JPEG, ...) into one preallocated uint8 array."""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from hdcfl_ray.errors import ScenarioError

ImageSource = bytes | Path

# The most pixels one image may declare in its header, checked before any pixel is
# decoded: 4096 x 4096, far above what a federated client's classifier reads (32 x 32
# to 224 x 224), far below what a 48 KB PNG can claim (20000 x 20000 decodes to 1.2 GB).
MAX_IMAGE_PIXELS = 4096 * 4096


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
    _check_memory(len(sources), height, width, channels, describe(0))
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


def _check_memory(count: int, height: int, width: int, channels: int, first: str) -> None:
    """The decoded array must fit in this machine's memory: refuse before allocating it."""
    from hdcfl_ray.host_memory import machine_memory_bytes

    needed = count * height * width * channels
    memory = machine_memory_bytes()
    if memory is not None and needed > memory // 2:
        raise ScenarioError(
            f"{first} is {width}x{height} pixels, so the {count} images of the dataset would take "
            f"{needed / 2**30:.3g} GiB decoded, more than half this machine's {memory / 2**30:.0f} GiB; resize them first"
        )


def _open(sources: Sequence[ImageSource], index: int, describe: Callable[[int], str]) -> Image.Image:
    """Open an image and read its header only; files other than regular ones (a named
    pipe would block forever, a device never end) and images whose header declares more
    than MAX_IMAGE_PIXELS pixels are refused before any pixel is decoded."""
    source = sources[index]
    if isinstance(source, Path):
        try:
            mode = os.stat(source).st_mode
        except OSError as error:
            raise ScenarioError(f"{describe(index)}: cannot be read ({error.strerror or error})") from None
        if not stat.S_ISREG(mode):
            raise ScenarioError(f"{describe(index)}: not a regular file (a pipe, socket or device); images must be files")
    try:
        image = Image.open(io.BytesIO(source) if isinstance(source, bytes) else source)
    except Image.DecompressionBombError as error:
        raise ScenarioError(f"{describe(index)}: refused, its header declares too many pixels ({error})") from None
    except (UnidentifiedImageError, OSError, ValueError) as error:
        raise ScenarioError(f"{describe(index)}: not a readable image file ({error})") from error
    width, height = image.size
    if width * height > MAX_IMAGE_PIXELS:
        image.close()
        raise ScenarioError(
            f"{describe(index)}: its header declares {width}x{height} pixels, more than the {MAX_IMAGE_PIXELS} "
            "an image may have here (4096 x 4096); resize the images first"
        )
    return image
