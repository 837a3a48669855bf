"""Data that would explode or hang is refused before it does: a label far past any
class count, image headers that declare more pixels than the stated maximum (a
48 KB PNG can claim 20000 x 20000), a first image that would size the whole array
past memory, a named pipe among the images. Each is a ScenarioError (exit 2)
naming the file, raised before any pixel is decoded."""

from __future__ import annotations

import os
import struct
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from hdcfl_ray.config.schema import DatasetConfig
from hdcfl_ray.data.sources import load_dataset
from hdcfl_ray.data.sources.parquet_images import MAX_CLASSES
from hdcfl_ray.errors import ScenarioError
from tests.test_data_sources import png_bytes, random_images, write_class_folders


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header declares `width` x `height` grey pixels, with a few bytes of
    (incomplete) pixel data: what a decompression bomb looks like before decoding."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    pixels = zlib.compress(b"\0" * (width + 1) * 64, 9)  # the first rows only
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def write_parquet(folder: Path, labels: list[int], blobs: list[bytes] | None = None) -> None:
    folder.mkdir(exist_ok=True)
    blobs = blobs or [png_bytes(image) for image in random_images(len(labels))]
    for name in ("train.parquet", "test.parquet"):
        table = pa.table({"image": pa.array(blobs, type=pa.binary()), "label": pa.array(labels, type=pa.int64())})
        pq.write_table(table, folder / name)


def parquet_config(folder: Path) -> DatasetConfig:
    return DatasetConfig(name="parquet_images", path=str(folder))


def test_a_label_of_two_billion_is_refused_naming_the_row(tmp_path):
    write_parquet(tmp_path / "data", [0, 1, 2_000_000_000, 1])
    with pytest.raises(ScenarioError, match=f"label 2000000000 \\(row 2\\).*at most {MAX_CLASSES} classes"):
        load_dataset(parquet_config(tmp_path / "data"), 0)


def test_a_48_kb_png_declaring_20000_by_20000_pixels_is_refused_before_decoding(tmp_path):
    bomb = png_header_only(20_000, 20_000)
    assert len(bomb) < 48 * 1024
    write_parquet(tmp_path / "data", [0, 1], [bomb, bomb])
    with pytest.raises(ScenarioError, match="row 0.*too many pixels|row 0.*20000x20000"):
        load_dataset(parquet_config(tmp_path / "data"), 0)


def test_a_10000_by_10000_first_image_is_refused_before_the_array_is_allocated(tmp_path):
    root = tmp_path / "images"
    write_class_folders(root, {"a": 3, "b": 3})
    (root / "a" / "0.png").write_bytes(png_header_only(10_000, 10_000))  # sorted first
    with pytest.raises(ScenarioError, match="0.png: its header declares 10000x10000 pixels"):
        load_dataset(DatasetConfig(name="image_folder", path=str(root)), 0)


def test_images_that_would_not_fit_in_memory_together_are_refused(tmp_path, monkeypatch):
    import hdcfl_ray.host_memory as host_memory

    root = tmp_path / "images"
    write_class_folders(root, {"a": 3, "b": 3})
    monkeypatch.setattr(host_memory, "machine_memory_bytes", lambda: 200)  # 6 images of 6x6x3 = 648 bytes
    with pytest.raises(ScenarioError, match="6 images of the dataset would take"):
        load_dataset(DatasetConfig(name="image_folder", path=str(root)), 0)


def test_a_named_pipe_among_the_images_is_refused_instead_of_read(tmp_path):
    root = tmp_path / "images"
    write_class_folders(root, {"a": 3, "b": 3})
    fifo = root / "a" / "x.png"
    os.mkfifo(fifo)
    unblocked = threading.Event()

    def unblock_a_reader_after(seconds: float) -> None:
        # if the loader opened the pipe it would wait forever for a writer: give it one
        if not unblocked.wait(seconds):
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass

    watchdog = threading.Thread(target=unblock_a_reader_after, args=(20.0,), daemon=True)
    watchdog.start()
    started = time.monotonic()
    try:
        with pytest.raises(ScenarioError) as refused:
            load_dataset(DatasetConfig(name="image_folder", path=str(root)), 0)
    finally:
        unblocked.set()
    assert time.monotonic() - started < 10  # a loader that opens the pipe waits for the watchdog's writer (20 s)
    assert "x.png: not a regular file" in str(refused.value)


def test_cifar_labels_past_the_class_names_are_refused(tmp_path):
    from tests.test_data_sources import cifar_batch, write_pickle

    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for number in range(1, 6):
        write_pickle(folder / f"data_batch_{number}", cifar_batch(random_images(2, size=32), [number, 0], b"labels"))
    write_pickle(folder / "test_batch", cifar_batch(random_images(2, size=32), [9, 2_000_000_000], b"labels"))
    write_pickle(folder / "batches.meta", {b"label_names": [f"name{i}".encode() for i in range(10)]})
    with pytest.raises(ScenarioError, match="test_batch: labels must be class indices 0..9"):
        load_dataset(DatasetConfig(name="cifar10", path=str(tmp_path)), 0)


def test_ordinary_images_still_load(tmp_path):
    root = tmp_path / "images"
    write_class_folders(root, {"a": 4, "b": 4})
    dataset = load_dataset(DatasetConfig(name="image_folder", path=str(root), test_fraction=0.25), 0)
    assert dataset.train_images.shape[1:] == (6, 6, 3) and dataset.num_classes == 2
    assert Image.MAX_IMAGE_PIXELS is not None  # Pillow's own guard is left in place
    assert np.issubdtype(dataset.train_images.dtype, np.uint8)
