"""Data sources and the batch transform: shapes, labels, classes, seeds and clear refusals."""

from __future__ import annotations

import io
import json
import os
import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from hdcfl_ray.config.schema import DatasetConfig
from hdcfl_ray.data.sources import dataset_num_classes_hint, load_dataset
from hdcfl_ray.data.sources.cifar import CIFAR10, CIFAR100, load_cifar
from hdcfl_ray.data.transforms import to_float_batch
from hdcfl_ray.errors import ScenarioError


def random_images(count: int, size: int = 6, channels: int = 3, seed: int = 0) -> np.ndarray:
    shape = (count, size, size, channels) if channels == 3 else (count, size, size)
    return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)


def png_bytes(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


# --- digits and synthetic ---------------------------------------------------------------


def test_digits_are_8x8_grayscale_uint8_with_a_stratified_test_split() -> None:
    dataset = load_dataset(DatasetConfig(name="digits", test_fraction=0.2), seed=0)
    assert dataset.train_images.shape == (1437, 8, 8, 1) and dataset.test_images.shape == (360, 8, 8, 1)
    assert dataset.train_images.dtype == np.uint8 and dataset.train_labels.dtype == np.int64
    assert dataset.train_images.max() == 255 and dataset.classes == tuple(str(digit) for digit in range(10))
    test_counts = np.bincount(dataset.test_labels, minlength=10)
    assert test_counts.min() >= 35 and test_counts.max() <= 37


def test_digits_split_depends_on_the_seed_only() -> None:
    first, again, other = (load_dataset(DatasetConfig(name="digits"), seed) for seed in (1, 1, 2))
    assert np.array_equal(first.test_images, again.test_images)
    assert not np.array_equal(first.test_images, other.test_images)


def test_synthetic_is_deterministic_per_seed_and_shaped_by_its_config() -> None:
    config = DatasetConfig(
        name="synthetic", num_classes=4, image_size=12, channels=1, train_samples=80, test_samples=40
    )
    first, again, other = (load_dataset(config, seed) for seed in (3, 3, 4))
    assert first.train_images.shape == (80, 12, 12, 1) and first.test_images.shape == (40, 12, 12, 1)
    assert np.array_equal(first.train_images, again.train_images)
    assert np.array_equal(first.test_labels, again.test_labels)
    assert not np.array_equal(first.train_images, other.train_images)
    assert np.bincount(first.train_labels).tolist() == [20, 20, 20, 20]


def test_synthetic_classes_are_separable_by_their_mean_image() -> None:
    dataset = load_dataset(DatasetConfig(name="synthetic", num_classes=10, train_samples=500, test_samples=200), 0)
    train = dataset.train_images.reshape(500, -1).astype(np.float64)
    test = dataset.test_images.reshape(200, -1).astype(np.float64)
    centroids = np.stack([train[dataset.train_labels == label].mean(axis=0) for label in range(10)])
    predicted = np.argmin(((test[:, None, :] - centroids[None]) ** 2).sum(axis=2), axis=1)
    assert (predicted == dataset.test_labels).mean() > 0.9


def test_max_samples_keep_a_seeded_subset_in_original_order() -> None:
    full = load_dataset(DatasetConfig(name="digits"), seed=0)
    config = DatasetConfig(name="digits", max_train_samples=100, max_test_samples=30)
    subset, again = load_dataset(config, 0), load_dataset(config, 0)
    assert subset.train_labels.shape == (100,) and subset.test_labels.shape == (30,)
    assert np.array_equal(subset.train_images, again.train_images)
    rows = [int(np.flatnonzero((full.train_images == image).all(axis=(1, 2, 3)))[0]) for image in subset.train_images]
    assert rows == sorted(rows)


def test_num_classes_hint_is_known_only_without_reading_data() -> None:
    assert dataset_num_classes_hint(DatasetConfig(name="digits")) == 10
    assert dataset_num_classes_hint(DatasetConfig(name="cifar100")) == 100
    assert dataset_num_classes_hint(DatasetConfig(name="synthetic", num_classes=7)) == 7
    assert dataset_num_classes_hint(DatasetConfig(name="parquet_images", path="x")) is None


# --- parquet tables ----------------------------------------------------------------------


def write_table(path: Path, images: np.ndarray, labels: list[int], as_struct: bool, classes: list[str] | None) -> None:
    blobs = [png_bytes(image) for image in images]
    column = (
        pa.array([{"bytes": blob, "path": f"{index}.png"} for index, blob in enumerate(blobs)])
        if as_struct
        else pa.array(blobs, type=pa.binary())
    )
    table = pa.table({"image": column, "label": pa.array(labels, type=pa.int16())})
    if classes is not None:
        table = table.replace_schema_metadata({"classes": json.dumps(classes)})
    pq.write_table(table, path)


@pytest.mark.parametrize("as_struct", [False, True], ids=["bytes_column", "struct_column"])
def test_parquet_table_loads_images_labels_and_class_names(tmp_path: Path, as_struct: bool) -> None:
    train, test = random_images(5), random_images(3, seed=1)
    write_table(tmp_path / "train.parquet", train, [0, 1, 2, 1, 0], as_struct, ["cat", "dog", "emu"])
    write_table(tmp_path / "test.parquet", test, [2, 2, 0], as_struct, ["cat", "dog", "emu"])
    dataset = load_dataset(DatasetConfig(name="parquet_images", path=str(tmp_path)), seed=0)
    assert np.array_equal(dataset.train_images, train) and np.array_equal(dataset.test_images, test)
    assert dataset.train_labels.tolist() == [0, 1, 2, 1, 0] and dataset.test_labels.dtype == np.int64
    assert dataset.classes == ("cat", "dog", "emu")


def test_parquet_grayscale_images_keep_one_channel_and_names_default_to_numbers(tmp_path: Path) -> None:
    train, test = random_images(4, channels=1), random_images(2, channels=1, seed=1)
    write_table(tmp_path / "digits_train.parquet", train, [0, 3, 1, 1], False, None)
    write_table(tmp_path / "digits_test.parquet", test, [3, 0], False, None)
    dataset = load_dataset(DatasetConfig(name="parquet_images", path=str(tmp_path / "digits_train.parquet")), 0)
    assert dataset.train_images.shape == (4, 6, 6, 1) and np.array_equal(dataset.test_images[..., 0], test)
    assert dataset.classes == ("0", "1", "2", "3")


def test_parquet_missing_folder_names_dataset_path(tmp_path: Path) -> None:
    expected = r"dataset\.path: .*nowhere does not exist; expected a folder holding train\.parquet"
    with pytest.raises(ScenarioError, match=expected):
        load_dataset(DatasetConfig(name="parquet_images", path=str(tmp_path / "nowhere")), 0)


def test_parquet_missing_column_names_the_key_and_lists_the_columns(tmp_path: Path) -> None:
    for split in ("train", "test"):
        write_table(tmp_path / f"{split}.parquet", random_images(2), [0, 1], False, None)
    config = DatasetConfig(name="parquet_images", path=str(tmp_path), image_column="img")
    expected = r"dataset\.image_column: .* no column 'img'; its columns are: image, label"
    with pytest.raises(ScenarioError, match=expected):
        load_dataset(config, 0)


def test_image_sizes_must_agree_and_the_odd_one_is_named(tmp_path: Path) -> None:
    blobs = [png_bytes(random_images(1)[0]), png_bytes(random_images(1, size=7)[0])]
    for split in ("train", "test"):
        pq.write_table(pa.table({"image": pa.array(blobs), "label": pa.array([0, 1])}), tmp_path / f"{split}.parquet")
    with pytest.raises(ScenarioError, match=r"train\.parquet row 1 \('image'\) is 7x7 pixels but .* row 0 .* is 6x6"):
        load_dataset(DatasetConfig(name="parquet_images", path=str(tmp_path)), 0)


# --- CIFAR files -------------------------------------------------------------------------


def write_pickle(path: Path, content: object) -> None:
    with path.open("wb") as file:
        pickle.dump(content, file, protocol=2)  # the protocol of the published CIFAR files


class Python2StylePickler(pickle.Pickler):
    """Writes arrays as the published CIFAR files hold them: raw data as a latin1 text string."""

    def reducer_override(self, obj: object) -> object:
        if not isinstance(obj, np.ndarray):
            return NotImplemented
        reconstruct = np.ndarray.__reduce__(obj)[0]
        state = (1, obj.shape, obj.dtype, False, obj.tobytes().decode("latin1"))
        return reconstruct, (np.ndarray, (0,), b"b"), state


def write_python2_style_pickle(path: Path, content: dict[str, object]) -> None:
    buffer = io.BytesIO()
    Python2StylePickler(buffer, protocol=2).dump(content)
    # Files written under numpy 1 name the reconstructor by its old module path.
    path.write_bytes(buffer.getvalue().replace(b"numpy._core.multiarray", b"numpy.core.multiarray"))


def cifar_batch(images: np.ndarray, labels: list[int], label_key: bytes) -> dict[bytes, object]:
    return {b"data": images.transpose(0, 3, 1, 2).reshape(len(labels), 3072), label_key: labels}


def test_cifar10_folder_loads_channel_last_images_and_label_names(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    batches = [random_images(2, size=32, seed=seed) for seed in range(6)]
    for number in range(2, 6):
        write_pickle(folder / f"data_batch_{number}", cifar_batch(batches[number - 1], [number, 0], b"labels"))
    first_batch = {key.decode(): value for key, value in cifar_batch(batches[0], [1, 0], b"labels").items()}
    write_python2_style_pickle(folder / "data_batch_1", first_batch)
    write_pickle(folder / "test_batch", cifar_batch(batches[5], [9, 8], b"labels"))
    write_pickle(folder / "batches.meta", {b"label_names": [f"name{i}".encode() for i in range(10)]})
    dataset = load_dataset(DatasetConfig(name="cifar10", path=str(tmp_path)), 0)
    assert np.array_equal(dataset.train_images, np.concatenate(batches[:5]))
    assert dataset.train_labels.tolist() == [1, 0, 2, 0, 3, 0, 4, 0, 5, 0]
    assert np.array_equal(dataset.test_images, batches[5]) and dataset.test_labels.tolist() == [9, 8]
    assert dataset.classes[:2] == ("name0", "name1") and dataset.num_classes == 10


def test_cifar100_folder_uses_fine_labels(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    train, test = random_images(3, size=32), random_images(1, size=32, seed=1)
    write_pickle(folder / "train", {**cifar_batch(train, [5, 99, 0], b"fine_labels"), b"coarse_labels": [1, 2, 3]})
    write_pickle(folder / "test", {**cifar_batch(test, [42], b"fine_labels"), b"coarse_labels": [4]})
    fine_names = [f"f{i}".encode() for i in range(100)]
    write_pickle(folder / "meta", {b"fine_label_names": fine_names, b"coarse_label_names": []})
    dataset = load_cifar(CIFAR100, tmp_path)
    assert dataset.train_labels.tolist() == [5, 99, 0] and dataset.test_labels.tolist() == [42]
    assert np.array_equal(dataset.train_images, train) and len(dataset.classes) == 100


def test_missing_cifar_files_say_where_we_looked_and_how_to_fix_it(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError) as caught:
        load_cifar(CIFAR10, tmp_path, download=False)
    message = str(caught.value)
    assert str(tmp_path / "cifar-10-batches-py") in message and "data_batch_1" in message
    assert "dataset.download: true" in message and "cifar-10-batches-py folder" in message


def test_cifar_default_root_is_the_data_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ScenarioError, match=r"not in data/cifar-100-python"):
        load_dataset(DatasetConfig(name="cifar100"), 0)


class RunsAShellCommand:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_that_calls_a_forbidden_global_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for name in CIFAR10.files:
        write_pickle(folder / name, {b"data": RunsAShellCommand(tmp_path / "marker"), b"labels": []})
    with pytest.raises(ScenarioError, match=r"refused to load: the file references (posix|os|nt)\.system"):
        load_cifar(CIFAR10, tmp_path)
    assert not (tmp_path / "marker").exists()


# --- image folders -----------------------------------------------------------------------


def write_class_folders(root: Path, per_class: dict[str, int], seed: int = 0) -> None:
    for offset, (name, count) in enumerate(per_class.items()):
        (root / name).mkdir(parents=True)
        for index, image in enumerate(random_images(count, seed=seed + offset)):
            Image.fromarray(image).save(root / name / f"{index}.png")


def test_image_folder_with_train_and_test_folders_keeps_them(tmp_path: Path) -> None:
    write_class_folders(tmp_path / "train", {"b_dog": 3, "a_cat": 2})
    write_class_folders(tmp_path / "test", {"a_cat": 1, "b_dog": 2}, seed=5)
    dataset = load_dataset(DatasetConfig(name="image_folder", path=str(tmp_path)), 0)
    assert dataset.classes == ("a_cat", "b_dog")
    assert dataset.train_labels.tolist() == [0, 0, 1, 1, 1] and dataset.test_labels.tolist() == [0, 1, 1]
    assert dataset.train_images.shape == (5, 6, 6, 3)


def test_image_folder_without_splits_holds_out_a_seeded_stratified_test_fraction(tmp_path: Path) -> None:
    write_class_folders(tmp_path, {"one": 10, "two": 10})
    config = DatasetConfig(name="image_folder", path=str(tmp_path), test_fraction=0.3)
    dataset, again = load_dataset(config, 1), load_dataset(config, 1)
    assert np.bincount(dataset.test_labels).tolist() == [3, 3] and dataset.train_labels.shape == (14,)
    assert np.array_equal(dataset.test_images, again.test_images)


def test_image_folder_names_an_image_of_the_wrong_size(tmp_path: Path) -> None:
    write_class_folders(tmp_path, {"one": 2, "two": 2})
    Image.fromarray(random_images(1, size=9)[0]).save(tmp_path / "two" / "odd.png")
    with pytest.raises(ScenarioError, match=r"two/odd\.png is 9x9 pixels but .* is 6x6"):
        load_dataset(DatasetConfig(name="image_folder", path=str(tmp_path)), 0)


# --- batch transform ---------------------------------------------------------------------


def test_float_batch_is_channel_first_and_normalised_to_minus_one_one() -> None:
    images = np.array([[[[0, 255, 51]]]], dtype=np.uint8)
    batch = to_float_batch(images, 0.0)
    assert batch.dtype == torch.float32 and batch.shape == (1, 3, 1, 1)
    assert torch.allclose(batch.flatten(), torch.tensor([-1.0, 1.0, -0.6]))


def as_uint8_images(batch: torch.Tensor) -> np.ndarray:
    return np.rint((batch.numpy() + 1.0) * 127.5).astype(np.uint8).transpose(0, 2, 3, 1)


def test_rotating_by_90_four_times_returns_the_same_batch() -> None:
    images = random_images(4, size=5)
    turned = as_uint8_images(to_float_batch(images, 90.0))
    assert not np.array_equal(turned, images)
    for _ in range(3):
        turned = as_uint8_images(to_float_batch(turned, 90.0))
    assert np.array_equal(turned, images)
    assert torch.equal(to_float_batch(images, 360.0), to_float_batch(images, 0.0))


@pytest.mark.parametrize("degrees", [90.0, 180.0, 270.0, -90.0])
def test_quarter_turns_equal_numpy_rot90_exactly(degrees: float) -> None:
    images = random_images(3, size=7)
    expected = to_float_batch(np.ascontiguousarray(np.rot90(images, k=int(degrees // 90), axes=(1, 2))), 0.0)
    assert torch.equal(to_float_batch(images, degrees), expected)
    assert torch.equal(to_float_batch(torch.from_numpy(images), degrees), expected)


def test_other_angles_rotate_bilinearly_with_the_same_shape() -> None:
    images = np.full((2, 9, 9, 1), 200, dtype=np.uint8)
    batch = to_float_batch(images, 45.0)
    assert batch.shape == (2, 1, 9, 9)
    assert batch[0, 0, 4, 4].item() == pytest.approx(200 * 2 / 255 - 1, abs=1e-5)
    assert batch[0, 0, 0, 0].item() == pytest.approx(-1.0)  # corners rotate in from outside: black


@pytest.mark.parametrize("source", ["parquet_images", "image_folder", "huggingface", "text", "leaf_json", "shakespeare_plays"])
def test_a_missing_relative_path_names_the_folder_it_was_read_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str) -> None:
    monkeypatch.chdir(tmp_path)
    keys: dict[str, object] = {"text_column": "x", "target_column": "y"} if source == "text" else {}
    with pytest.raises(ScenarioError) as refused:
        load_dataset(DatasetConfig(name=source, path="scenarios/data/nowhere", **keys), 0)
    message = str(refused.value)
    assert "dataset.path: scenarios/data/nowhere does not exist" in message
    assert str(tmp_path) in message and "absolute path" in message
