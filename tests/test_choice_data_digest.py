"""A kept choice belongs to everything that makes the clients: data written again at the
same path with the same images and labels but its id column permuted among rows moves
samples to other clients, so it gets another data digest (and so another cache entry)
on every source that reads ids: Hugging Face folders, Parquet, LEAF's JSON and text;
written again unchanged, it keeps its digest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import hdcfl_ray
from hdcfl_ray.auto_knobs.cache import CACHE_VARIABLE
from hdcfl_ray.auto_knobs.digests import data_digest
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.data.standins.femnist import write_femnist_standin
from hdcfl_ray.data.standins.leaf_json import leaf_users_from_parquet, write_leaf_json
from hdcfl_ray.data.standins.shakespeare import write_shakespeare_standin
from hdcfl_ray.runtime.driver import prepare_run
from tests.digits_parquet import write_digits_parquet

SHARD = Path("data") / "train-00000-of-00001.parquet"


def _permuted_column(path: Path, column: str, seed: int) -> None:
    """`path` written again in place, `column` permuted among its rows (nothing else moves)."""
    table = pq.read_table(path)
    values = table.column(column).to_pylist()
    order = np.random.default_rng(seed).permutation(len(values))
    index = table.schema.get_field_index(column)
    table = table.set_column(index, table.schema.field(index), pa.array([values[i] for i in order], table.schema.field(index).type))
    pq.write_table(table, path)


def _rewritten(path: Path) -> None:
    pq.write_table(pq.read_table(path), path)


def _rotate_leaf_users(folder: Path) -> None:
    """Every user's samples handed to the next user in every file (train and test alike):
    the same images and labels, held by other users."""
    for path in sorted(folder.rglob("*.json")):
        document = json.loads(path.read_text())
        users = document["users"]
        data, counts = document["user_data"], dict(zip(users, document["num_samples"]))
        document["user_data"] = {user: data[users[(i + 1) % len(users)]] for i, user in enumerate(users)}
        document["num_samples"] = [counts[users[(i + 1) % len(users)]] for i in range(len(users))]
        path.write_text(json.dumps(document))


def _natural(dataset: dict[str, Any], partition_by: str, encoder: dict[str, Any], clients: int = 6) -> dict[str, Any]:
    return {
        "name": "ids",
        "seed": 3,
        "dataset": dataset,
        "partition": {"kind": "natural_id", "partition_by": partition_by, "num_clients": clients, "min_samples": 4},
        "model": encoder,
        "algorithm": {"name": "fedavg"},
        "protocol": {"rounds": 1, "batch_size": 16},
        "runtime": {"backend": "local"},
    }


IMAGE_MODEL = {"encoder": "small_cnn", "width": 8, "feature_dim": 32}
TEXT_MODEL = {"encoder": "char_lstm", "feature_dim": 16}


def _huggingface(root: Path) -> tuple[dict[str, Any], Callable[[], None], Callable[[], None]]:
    folder = write_femnist_standin(root / "femnist", writers=16, mean_samples=24, seed=3)
    scenario = _natural({"name": "huggingface", "path": str(folder), "label_column": "character", "test_split": None}, "writer_id", IMAGE_MODEL)
    return scenario, lambda: _permuted_column(folder / SHARD, "writer_id", 0), lambda: _rewritten(folder / SHARD)


def _parquet(root: Path) -> tuple[dict[str, Any], Callable[[], None], Callable[[], None]]:
    folder = write_digits_parquet(root / "parquet", writers=12)
    scenario = _natural({"name": "parquet_images", "path": str(folder)}, "writer_id", IMAGE_MODEL)

    def permute() -> None:
        for part in ("train", "test"):
            _permuted_column(folder / f"{part}.parquet", "writer_id", 1)

    def unchanged() -> None:
        for part in ("train", "test"):
            _rewritten(folder / f"{part}.parquet")

    return scenario, permute, unchanged


def _leaf(root: Path) -> tuple[dict[str, Any], Callable[[], None], Callable[[], None]]:
    femnist = write_femnist_standin(root / "femnist", writers=16, mean_samples=24, seed=3)
    folder = write_leaf_json(root / "leaf", leaf_users_from_parquet(femnist / SHARD, "writer_id", "image", "character"))
    scenario = _natural({"name": "leaf_json", "path": str(folder)}, "users", IMAGE_MODEL)

    def unchanged() -> None:
        for path in folder.rglob("*.json"):
            path.write_text(json.dumps(json.loads(path.read_text())))

    return scenario, lambda: _rotate_leaf_users(folder), unchanged


def _text(root: Path) -> tuple[dict[str, Any], Callable[[], None], Callable[[], None]]:
    folder = write_shakespeare_standin(root / "shakespeare", roles=8, mean_characters=160, seed=3, length=12)
    dataset = {"name": "text", "path": str(folder), "text_column": "x", "target_column": "y", "sequence_length": 12, "test_split": None}
    scenario = _natural(dataset, "character_id", TEXT_MODEL)
    return scenario, lambda: _permuted_column(folder / SHARD, "character_id", 2), lambda: _rewritten(folder / SHARD)


SOURCES = {"huggingface": _huggingface, "parquet_images": _parquet, "leaf_json": _leaf, "text": _text}


def _digest_and_clients(scenario: dict[str, Any]) -> tuple[str, list[list[bytes]]]:
    """The data digest, and what each client holds (its training samples' contents, whatever their rows)."""
    prepared = prepare_run(build_scenario(scenario))
    images, labels = prepared.dataset.train_images, prepared.dataset.train_labels
    clients = [sorted(images[i].tobytes() + labels[i].tobytes() for i in client.train_indices) for client in prepared.partition.clients]
    return data_digest(prepared.dataset, prepared.partition), clients


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_ids_permuted_in_place_give_another_digest_and_unchanged_data_the_same(tmp_path: Path, source: str) -> None:
    scenario, permute, rewrite = SOURCES[source](tmp_path)
    digest, clients = _digest_and_clients(scenario)
    rewrite()  # the same contents written again: the same digest
    assert _digest_and_clients(scenario)[0] == digest
    permute()
    moved_digest, moved_clients = _digest_and_clients(scenario)
    assert moved_clients != clients  # samples went to other clients ...
    assert moved_digest != digest  # ... so a choice made before is not theirs


def test_ids_moved_with_the_images_and_labels_unchanged_are_covered() -> None:
    """The arrays a choice saw are the same but the ids are not: another digest (the case
    the images-and-labels digest missed)."""
    from hdcfl_ray.data.dataset import ImageDataset

    images = np.zeros((6, 2, 2, 1), np.uint8)
    labels = np.arange(6) % 2
    ids = np.array([0, 0, 1, 1, 2, 2])
    before = ImageDataset("d", images, labels, images, labels, ("a", "b"), ids, ids, ("x", "y", "z"))
    after = ImageDataset("d", images, labels, images, labels, ("a", "b"), ids[::-1].copy(), ids, ("x", "y", "z"))
    renamed = ImageDataset("d", images, labels, images, labels, ("a", "b"), ids, ids, ("x", "y", "w"))
    assert len({data_digest(before), data_digest(after), data_digest(renamed)}) == 3


@pytest.mark.auto_knobs
def test_a_run_after_ids_permuted_in_place_makes_a_new_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "cache"))
    scenario, permute, _ = _parquet(tmp_path)
    scenario["algorithm"] = {"name": "ifca", "ifca": {"clusters": "auto"}}
    first = hdcfl_ray.simulate(scenario, out=tmp_path / "first", progress=False)
    again = hdcfl_ray.simulate(scenario, out=tmp_path / "again", progress=False)
    assert again.manifest["auto_knobs"]["from_cache"] is True
    permute()
    moved = hdcfl_ray.simulate(scenario, out=tmp_path / "moved", progress=False)
    assert moved.manifest["auto_knobs"]["from_cache"] is False
    assert moved.manifest["auto_knobs"]["cache"] != first.manifest["auto_knobs"]["cache"]
