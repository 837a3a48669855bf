"""The loading path of the CPU and paper scenarios on tiny generated data: scenario file
-> environment variable or --set override -> data source -> seeded subset -> partition
(`prepare_run`), for a Parquet table of JPEG bytes (the layout of the CIFAR-10 Parquet copy that
scripts/cifar10_to_parquet.py --format jpeg writes) and for torchvision's python-format CIFAR-10
folder. No real data is read.

tests/test_data_sources.py covers the sources on their own (columns, grayscale, struct
columns, channel order, refusals); this file covers what the scenarios add on top."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from hdcfl_ray.config.loading import load_scenario
from hdcfl_ray.data.sources import _seeded_subset, load_dataset
from hdcfl_ray.data.sources import parquet_images as parquet_source
from hdcfl_ray.runtime.driver import prepare_run
from tests.fake_cifar10 import write_torchvision_cifar10

REPO = Path(__file__).resolve().parents[1]
CPU = REPO / "scenarios" / "cpu"
PAPER = REPO / "scenarios" / "paper"
CLASS_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
NUM_CLASSES = len(CLASS_NAMES)
TRAIN_ROWS, TEST_ROWS = 80, 40  # the tables on disk
KEEP_TRAIN, KEEP_TEST = 48, 24  # dataset.max_train_samples / max_test_samples
TEST_PER_CLIENT = 5


def smooth_images(count: int, seed: int) -> np.ndarray:
    """32x32 RGB images that JPEG keeps close to their pixels: a colour gradient plus mild noise."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0.0, 1.0, 32, dtype=np.float32)
    base = rng.uniform(40, 200, size=(count, 1, 1, 3)).astype(np.float32)
    slope = rng.uniform(-40, 40, size=(count, 1, 1, 3)).astype(np.float32)
    images = base + slope * ramp[None, :, None, None] + rng.normal(0.0, 2.0, size=(count, 32, 32, 3))
    return np.clip(np.rint(images), 0, 255).astype(np.uint8)


def balanced_labels(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).permutation(np.arange(count) % NUM_CLASSES).astype(np.int64)


def jpeg_bytes(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=95)
    return buffer.getvalue()


def write_jpeg_table(path: Path, images: np.ndarray, labels: np.ndarray) -> None:
    """The Parquet copy's layout (scripts/cifar10_to_parquet.py): binary `image`, int16 `label`, class names in metadata."""
    table = pa.table(
        {"image": pa.array([jpeg_bytes(image) for image in images], type=pa.binary()), "label": pa.array(labels, type=pa.int16())}
    )
    pq.write_table(table.replace_schema_metadata({"classes": json.dumps(CLASS_NAMES)}), path)


@pytest.fixture
def jpeg_tables(tmp_path: Path) -> dict[str, np.ndarray]:
    folder = tmp_path / "cifar10-jpeg"
    folder.mkdir()
    data = {
        "train_images": smooth_images(TRAIN_ROWS, seed=1),
        "train_labels": balanced_labels(TRAIN_ROWS, seed=2),
        "test_images": smooth_images(TEST_ROWS, seed=3),
        "test_labels": balanced_labels(TEST_ROWS, seed=4),
    }
    write_jpeg_table(folder / "train.parquet", data["train_images"], data["train_labels"])
    write_jpeg_table(folder / "test.parquet", data["test_images"], data["test_labels"])
    return data


@pytest.fixture
def decoded_rows(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many images each call of the Parquet source's decoder decoded."""
    counts: list[int] = []
    decode = parquet_source.decode_images

    def counting_decode(sources, describe):
        counts.append(len(sources))
        return decode(sources, describe)

    monkeypatch.setattr(parquet_source, "decode_images", counting_decode)
    return counts


def shrunk(kind: str, extra: list[str] | None = None) -> list[str]:
    """--set overrides that fit a scenario onto the tiny tables."""
    # label_subset: at most one holder per class, so no class runs out of samples
    clients = {"rotation": 4, "dirichlet": 4, "label_subset": 3}[kind]
    return [
        f"dataset.max_train_samples={KEEP_TRAIN}",
        f"dataset.max_test_samples={KEEP_TEST}",
        f"partition.num_clients={clients}",
        f"partition.test_per_client={TEST_PER_CLIENT}",
        "partition.min_samples=2",
        # validation reads the weights file and counts the GPUs: the paper's GPU settings
        # and ImageNet weights are not part of a data-loading test on a CPU machine
        "runtime.num_gpus_per_actor=0",
        "model.pretrained=null",
        *(extra or []),
    ]


def cpu_kind(path: Path) -> str:
    return {"rot": "rotation", "ls3": "label_subset", "ls2": "label_subset", "a0.07": "dirichlet"}[path.stem.split("-")[-1]]


# --- the CPU scenarios on a Parquet table of JPEG bytes ---------------------------------


@pytest.mark.parametrize("path", sorted(CPU.glob("cpu-*.yaml")), ids=lambda path: path.stem)
def test_cpu_scenario_loads_a_seeded_subset_of_the_jpeg_table_and_partitions_it(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jpeg_tables: dict[str, np.ndarray], decoded_rows: list[int]
) -> None:
    monkeypatch.setenv("HDCFL_CIFAR10_PARQUET", str(tmp_path / "cifar10-jpeg"))
    kind = cpu_kind(path)
    scenario = load_scenario(path, shrunk(kind))
    assert scenario.dataset.path == str(tmp_path / "cifar10-jpeg")

    prepared = prepare_run(scenario)

    dataset = prepared.dataset
    assert dataset.train_images.shape == (KEEP_TRAIN, 32, 32, 3) and dataset.test_images.shape == (KEEP_TEST, 32, 32, 3)
    assert dataset.train_images.dtype == np.uint8 and dataset.train_labels.dtype == np.int64
    assert dataset.classes == tuple(CLASS_NAMES) and dataset.num_classes == NUM_CLASSES
    assert decoded_rows == [KEEP_TRAIN, KEEP_TEST]  # only the kept rows were decoded
    train_rows, test_rows = seeded_rows(scenario.seed)
    assert np.array_equal(dataset.train_labels, jpeg_tables["train_labels"][train_rows])
    assert np.array_equal(dataset.test_labels, jpeg_tables["test_labels"][test_rows])
    # JPEG is lossy, but on smooth images every kept row stays close to the image written there
    error = np.abs(dataset.train_images.astype(np.int16) - jpeg_tables["train_images"][train_rows].astype(np.int16))
    assert error.mean() < 3.0
    assert_partition(prepared, kind, scenario.partition.k)


def seeded_rows(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows load_dataset keeps: the same seeded subset as subsetting after a full decode."""
    train_seed, test_seed = np.random.SeedSequence(seed).spawn(2)
    train_rows = _seeded_subset(TRAIN_ROWS, KEEP_TRAIN, train_seed)
    test_rows = _seeded_subset(TEST_ROWS, KEEP_TEST, test_seed)
    assert train_rows is not None and test_rows is not None
    return train_rows, test_rows


def assert_partition(prepared, kind: str, k: int | None) -> None:
    clients = prepared.partition.clients
    labels = prepared.dataset.train_labels
    used = np.concatenate([client.train_indices for client in clients])
    assert np.unique(used).size == used.size  # no training image is given to two clients
    assert all(0 < client.test_indices.size <= TEST_PER_CLIENT for client in clients)
    if kind == "rotation":
        assert [client.rotation_degrees for client in clients] == [0.0, 90.0, 180.0, 270.0]
        assert sorted(used.tolist()) == list(range(labels.size))
        assert [client.num_train for client in clients] == [labels.size // 4] * 4
    elif kind == "label_subset":
        assert all(np.unique(labels[client.train_indices]).size == k for client in clients)
        for client in clients:  # each client's test images come from its own classes
            assert set(prepared.dataset.test_labels[client.test_indices]) <= set(labels[client.train_indices])
    else:
        assert sorted(used.tolist()) == list(range(labels.size))
        assert all(client.num_train >= prepared.scenario.partition.min_samples for client in clients)


@pytest.mark.parametrize("seed", [42, 2026])
def test_max_samples_keep_the_same_rows_as_decoding_everything_then_subsetting(
    seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jpeg_tables: dict[str, np.ndarray], decoded_rows: list[int]
) -> None:
    monkeypatch.setenv("HDCFL_CIFAR10_PARQUET", str(tmp_path / "cifar10-jpeg"))
    subset_config = load_scenario(CPU / "cpu-c10-rot.yaml", shrunk("rotation", [f"seed={seed}"])).dataset
    full_config = subset_config.model_copy(update={"max_train_samples": None, "max_test_samples": None})

    subset = load_dataset(subset_config, seed)
    full = load_dataset(full_config, seed)

    assert decoded_rows == [KEEP_TRAIN, KEEP_TEST, TRAIN_ROWS, TEST_ROWS]
    train_rows, test_rows = seeded_rows(seed)
    assert np.array_equal(subset.train_images, full.train_images[train_rows])
    assert np.array_equal(subset.train_labels, full.train_labels[train_rows])
    assert np.array_equal(subset.test_images, full.test_images[test_rows])
    assert np.array_equal(subset.test_labels, full.test_labels[test_rows])


def test_a_paper_scenario_reads_the_parquet_copy_through_set_overrides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jpeg_tables: dict[str, np.ndarray]
) -> None:
    """scenarios/paper/README.md: --set dataset.name=parquet_images --set dataset.path=..."""
    monkeypatch.setenv("HDCFL_CIFAR10", str(tmp_path / "not-used"))
    monkeypatch.setenv("HDCFL_RESNET18_IMAGENET", str(tmp_path / "weights.pt"))  # unused: shrunk() sets model.pretrained to null
    overrides = ["dataset.name=parquet_images", f"dataset.path={tmp_path / 'cifar10-jpeg'}", *shrunk("rotation")]

    prepared = prepare_run(load_scenario(PAPER / "c10-rot.yaml", overrides))

    assert prepared.dataset.train_images.shape == (KEEP_TRAIN, 32, 32, 3)
    assert np.array_equal(prepared.dataset.train_labels, jpeg_tables["train_labels"][seeded_rows(42)[0]])
    assert_partition(prepared, "rotation", None)


# --- torchvision's python-format CIFAR-10 folder ------------------------------------------

BATCH_ROWS, CIFAR_TEST_ROWS = 12, 30  # 5 x 12 = 60 training images


def write_cifar10_folder(root: Path) -> dict[str, np.ndarray]:
    """cifar-10-batches-py/ as torchvision extracts it (tests/fake_cifar10.py)."""
    rng = np.random.default_rng(7)
    train_images = rng.integers(0, 256, size=(5 * BATCH_ROWS, 32, 32, 3), dtype=np.uint8)
    train_labels = balanced_labels(5 * BATCH_ROWS, seed=8)
    test_images = rng.integers(0, 256, size=(CIFAR_TEST_ROWS, 32, 32, 3), dtype=np.uint8)
    return write_torchvision_cifar10(root, train_images, train_labels, test_images, balanced_labels(CIFAR_TEST_ROWS, seed=9))


CIFAR_CASES = {
    # the paper scenario reads the folder from its environment variable
    "paper-c10-rot-env": (PAPER / "c10-rot.yaml", "rotation", lambda root: []),
    # a CPU scenario switched to the python-format folder with --set
    "cpu-c10-ls3-set": (CPU / "cpu-c10-ls3.yaml", "label_subset", lambda root: ["dataset.name=cifar10", f"dataset.path={root}"]),
}


@pytest.mark.parametrize("case", sorted(CIFAR_CASES))
def test_scenario_loads_a_cifar10_python_folder_and_keeps_a_seeded_subset(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, kind, extra = CIFAR_CASES[case]
    root = tmp_path / "cifar"
    written = write_cifar10_folder(root)
    monkeypatch.setenv("HDCFL_CIFAR10", str(root))
    monkeypatch.setenv("HDCFL_CIFAR10_PARQUET", str(tmp_path / "not-used"))
    monkeypatch.setenv("HDCFL_RESNET18_IMAGENET", str(tmp_path / "weights.pt"))
    keep_train, keep_test = 40, 20
    overrides = [*shrunk(kind), f"dataset.max_train_samples={keep_train}", f"dataset.max_test_samples={keep_test}", *extra(root)]
    scenario = load_scenario(path, overrides)
    assert (scenario.dataset.name, scenario.dataset.path) == ("cifar10", str(root))

    prepared = prepare_run(scenario)

    dataset = prepared.dataset
    assert dataset.name == "cifar10" and dataset.classes == tuple(CLASS_NAMES)
    assert dataset.train_images.shape == (keep_train, 32, 32, 3) and dataset.test_images.shape == (keep_test, 32, 32, 3)
    train_seed, test_seed = np.random.SeedSequence(scenario.seed).spawn(2)
    train_rows = _seeded_subset(5 * BATCH_ROWS, keep_train, train_seed)
    test_rows = _seeded_subset(CIFAR_TEST_ROWS, keep_test, test_seed)
    assert np.array_equal(dataset.train_images, written["train_images"][train_rows])  # rows span all five batches
    assert np.array_equal(dataset.train_labels, written["train_labels"][train_rows])
    assert np.array_equal(dataset.test_images, written["test_images"][test_rows])
    assert np.array_equal(dataset.test_labels, written["test_labels"][test_rows])
    assert_partition(prepared, kind, scenario.partition.k)
