"""scripts/cifar10_to_parquet.py turns torchvision's on-disk CIFAR-10 files into the Parquet folder the
CPU scenarios read, and the parquet_images source reads back the same images and labels. The CIFAR
files are tiny fakes written here in torchvision's format; nothing is downloaded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from hdcfl_ray.config.schema import DatasetConfig
from hdcfl_ray.data.sources import load_dataset
from tests.fake_cifar10 import CLASS_NAMES as CLASSES, write_torchvision_cifar10

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "cifar10_to_parquet.py"
BATCH_ROWS, TEST_ROWS = 4, 6


def write_fake_cifar10(root: Path) -> dict[str, np.ndarray]:
    """root/cifar-10-batches-py/ as torchvision extracts it (tests/fake_cifar10.py)."""
    rng = np.random.default_rng(3)
    train_images = rng.integers(0, 256, size=(5 * BATCH_ROWS, 32, 32, 3), dtype=np.uint8)
    test_images = rng.integers(0, 256, size=(TEST_ROWS, 32, 32, 3), dtype=np.uint8)
    return write_torchvision_cifar10(root, train_images, np.arange(5 * BATCH_ROWS) % 10, test_images, (np.arange(TEST_ROWS) * 3) % 10)


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_png_folder_reads_back_pixel_for_pixel(tmp_path: Path) -> None:
    expected = write_fake_cifar10(tmp_path / "data")
    out = tmp_path / "cifar10-parquet"
    result = run_script("--root", str(tmp_path / "data"), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert sorted(path.name for path in out.iterdir()) == ["test.parquet", "train.parquet"]
    table = pq.read_table(out / "train.parquet")
    assert table.column_names == ["image", "label"]
    assert str(table.schema.field("image").type) == "binary" and str(table.schema.field("label").type) == "int16"
    assert json.loads(table.schema.metadata[b"classes"]) == CLASSES

    dataset = load_dataset(DatasetConfig(name="parquet_images", path=str(out)), seed=0)
    np.testing.assert_array_equal(dataset.train_images, expected["train_images"])
    np.testing.assert_array_equal(dataset.train_labels, expected["train_labels"])
    np.testing.assert_array_equal(dataset.test_images, expected["test_images"])
    np.testing.assert_array_equal(dataset.test_labels, expected["test_labels"])
    assert list(dataset.classes) == CLASSES


def test_jpeg_folder_is_smaller_and_close(tmp_path: Path) -> None:
    expected = write_fake_cifar10(tmp_path / "data")
    out = tmp_path / "cifar10-jpeg"
    result = run_script("--root", str(tmp_path / "data"), "--out", str(out), "--format", "jpeg", "--quality", "95")
    assert result.returncode == 0, result.stderr
    first = pq.read_table(out / "test.parquet").column("image")[0].as_py()
    assert first[:2] == b"\xff\xd8"  # a JPEG stream
    dataset = load_dataset(DatasetConfig(name="parquet_images", path=str(out)), seed=0)
    assert dataset.test_images.shape == expected["test_images"].shape
    np.testing.assert_array_equal(dataset.test_labels, expected["test_labels"])


def test_missing_files_exit_2_and_say_where(tmp_path: Path) -> None:
    result = run_script("--root", str(tmp_path / "nothing"), "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "cifar-10-batches-py" in result.stderr and not (tmp_path / "out").exists()
