"""dataset.name: huggingface reads a dataset written by the `datasets` package (save_to_disk,
Parquet shards, or load_dataset with download: true) into the same arrays as its source."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

import hdcfl_ray
from hdcfl_ray.config.schema import DatasetConfig
from hdcfl_ray.data.sources import load_dataset
from hdcfl_ray.data.sources.digits import load_digits_dataset
from hdcfl_ray.errors import ScenarioError

datasets = pytest.importorskip("datasets")

ROOT = Path(__file__).resolve().parent.parent
SEED = 42  # the quickstart's seed: the digits source's test split depends on it


def png(image: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image[..., 0], mode="L").save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def digits_folders(tmp_path_factory) -> dict[str, Path]:
    """scikit-learn's digits, split as the digits source splits them at SEED, written by
    `datasets` twice: save_to_disk, and Parquet shards in the Hub's data/ layout."""
    source = load_digits_dataset(0.2, SEED)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=list(source.classes))})

    def split(images: np.ndarray, labels: np.ndarray):
        return datasets.Dataset.from_dict(
            {"image": [{"bytes": png(image), "path": None} for image in images], "label": labels.tolist()}, features=features
        )

    digits = datasets.DatasetDict(
        {"train": split(source.train_images, source.train_labels), "test": split(source.test_images, source.test_labels)}
    )
    root = tmp_path_factory.mktemp("hf")
    digits.save_to_disk(str(root / "saved"))
    (root / "shards" / "data").mkdir(parents=True)
    digits["train"].to_parquet(str(root / "shards" / "data" / "train-00000-of-00001.parquet"))
    digits["test"].to_parquet(str(root / "shards" / "data" / "test-00000-of-00001.parquet"))
    digits["train"].save_to_disk(str(root / "single"))  # one Dataset, no splits
    return {"saved": root / "saved", "shards": root / "shards", "single": root / "single"}


def test_saved_and_sharded_datasets_read_as_their_source(digits_folders):
    source = load_digits_dataset(0.2, SEED)
    for folder in ("saved", "shards"):
        loaded = load_dataset(DatasetConfig(name="huggingface", path=str(digits_folders[folder])), SEED)
        assert np.array_equal(loaded.train_images, source.train_images), folder
        assert np.array_equal(loaded.train_labels, source.train_labels), folder
        assert np.array_equal(loaded.test_images, source.test_images), folder
        assert np.array_equal(loaded.test_labels, source.test_labels), folder
        assert loaded.classes == source.classes and loaded.channels == 1


def test_subsets_and_a_held_out_test_split(digits_folders):
    source = load_digits_dataset(0.2, SEED)
    subset = load_dataset(
        DatasetConfig(name="huggingface", path=str(digits_folders["saved"]), max_train_samples=100, max_test_samples=50), SEED
    )
    assert subset.train_images.shape == (100, 8, 8, 1) and subset.test_images.shape == (50, 8, 8, 1)
    assert subset.num_classes == 10  # the class count of the whole split, not of the subset
    held_out = load_dataset(DatasetConfig(name="huggingface", path=str(digits_folders["single"]), test_split=None), SEED)
    assert held_out.train_labels.shape[0] + held_out.test_labels.shape[0] == source.train_labels.shape[0]
    assert sorted(np.unique(held_out.test_labels)) == list(range(10))


def test_the_quickstart_on_a_huggingface_copy_of_digits_matches_the_digits_run(tmp_path, digits_folders):
    import pyarrow.parquet as pq

    overrides = {"protocol.rounds": 2, "runtime.backend": "local", "runtime.num_cpus": 1, "seed": SEED, "algorithm.hdcfl.groups": 4}
    digits = hdcfl_ray.simulate(ROOT / "scenarios/quickstart.yaml", overrides=overrides, out=tmp_path / "digits", progress=False)
    copy = hdcfl_ray.simulate(
        ROOT / "scenarios/quickstart.yaml",
        overrides={**overrides, "dataset.name": "huggingface", "dataset.path": str(digits_folders["saved"])},
        out=tmp_path / "huggingface",
        progress=False,
    )
    assert copy.manifest["dataset"]["num_classes"] == 10 and copy.manifest["dataset"]["image_shape"] == [8, 8, 1]

    def accuracies(run):
        table = pq.read_table(run.dir / "clients.parquet").sort_by([("round", "ascending"), ("client_id", "ascending")])
        return table.column("accuracy").to_pylist()

    assert accuracies(copy) == accuracies(digits)
    assert copy.final["mean_accuracy"] == digits.final["mean_accuracy"]


def test_download_reads_with_load_dataset(tmp_path, digits_folders, monkeypatch):
    # load_dataset takes a local folder as well as a Hub id: the download path, offline
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    config = DatasetConfig(name="huggingface", hub_id=str(digits_folders["shards"]), download=True)
    loaded = load_dataset(config, SEED)
    source = load_digits_dataset(0.2, SEED)
    assert np.array_equal(loaded.test_images, source.test_images) and loaded.classes == source.classes


@pytest.mark.parametrize(
    ("changes", "fragments"),
    [
        ({}, ["give either dataset.path", "neither"]),
        ({"hub_id": "ylecun/mnist"}, ["dataset.hub_id 'ylecun/mnist'", "download: true"]),
        ({"path": "FOLDER:saved", "train_split": "training"}, ["dataset.train_split 'training'", "its splits are: train, test"]),
        ({"path": "FOLDER:shards", "test_split": "validation"}, ["dataset.test_split 'validation'", "train"]),
        ({"path": "FOLDER:saved", "image_column": "img"}, ["dataset.image_column", "'img'", "image, label"]),
        ({"path": "FOLDER:single"}, ["one saved Dataset", "test_split: null"]),
        ({"path": "/nonexistent/hf"}, ["dataset.path", "/nonexistent/hf", "does not exist"]),
    ],
)
def test_bad_settings_name_the_key(digits_folders, changes, fragments):
    settings = {key: str(digits_folders[value[7:]]) if str(value).startswith("FOLDER:") else value for key, value in changes.items()}
    with pytest.raises(ScenarioError) as raised:
        load_dataset(DatasetConfig(name="huggingface", **settings), SEED)
    for fragment in fragments:
        assert fragment in str(raised.value), f"{fragment!r} not in {raised.value}"
