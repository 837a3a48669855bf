"""`hdcfl-ray pretrain`: an encoder trained on images no client holds, saved as a
weights-only file that `model.pretrained` loads; runs record where their
initialisation came from and refuse to put the pool back into the clients' data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from cli import app
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.data.pretrain_pool import pool_rows
from hdcfl_ray.data.sources import load_dataset, load_pretrain_pool
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.pretraining import pretrain
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.terminal.live_view import QuietObserver
from tests.conftest import tiny_scenario

POOL = {"pretrain_pool": 0.25}


def _scenario(**sections):
    return build_scenario(tiny_scenario(**{"dataset": {"name": "digits", **POOL}, **sections}))


def test_the_pool_is_disjoint_and_fixed_by_its_own_seed() -> None:
    kept, pool = pool_rows(200, 0.25, pool_seed=0)
    assert len(pool) == 50 and np.intersect1d(kept, pool).size == 0 and len(kept) + len(pool) == 200
    assert np.array_equal(pool_rows(200, 0.25, 0)[1], pool) and not np.array_equal(pool_rows(200, 0.25, 1)[1], pool)
    assert len(pool_rows(3, 0.99, 0)[0]) == 1  # at least one row stays with the clients


def test_a_parquet_pool_is_picked_before_decoding_and_the_same_for_every_run_seed(tmp_path: Path) -> None:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    def table(count: int, offset: int) -> pa.Table:
        images = []
        for index in range(count):
            buffer = io.BytesIO()
            Image.fromarray(np.full((4, 4, 3), offset + index, dtype=np.uint8)).save(buffer, format="PNG")
            images.append(buffer.getvalue())
        return pa.table({"image": images, "label": [index % 3 for index in range(count)]})

    pq.write_table(table(60, 0), tmp_path / "train.parquet")
    pq.write_table(table(12, 100), tmp_path / "test.parquet")
    config = build_scenario(tiny_scenario(dataset={"name": "parquet_images", "path": str(tmp_path), "pretrain_pool": 0.25, "max_train_samples": 20})).dataset
    pools = [load_pretrain_pool(config, seed) for seed in (1, 2)]
    assert len(pools[0].train_labels) == 15 and np.array_equal(pools[0].train_images, pools[1].train_images)
    pool_pixels = {int(image[0, 0, 0]) for image in pools[0].train_images}
    for seed in (1, 2):
        shared = load_dataset(config, seed)
        assert len(shared.train_labels) == 20 and not pool_pixels & {int(image[0, 0, 0]) for image in shared.train_images}


def test_the_clients_never_see_the_pool() -> None:
    scenario = _scenario()
    full = load_dataset(scenario.dataset.model_copy(update={"pretrain_pool": None}), scenario.seed)
    shared, pool = load_dataset(scenario.dataset, scenario.seed), load_pretrain_pool(scenario.dataset, scenario.seed)
    assert len(shared.train_labels) + len(pool.train_labels) == len(full.train_labels)
    seen = {image.tobytes() for image in shared.train_images}
    assert not any(image.tobytes() in seen for image in pool.train_images)
    assert np.array_equal(shared.test_labels, full.test_labels)  # the test split is untouched


def test_pretraining_learns_saves_weights_only_and_is_deterministic(tmp_path: Path) -> None:
    scenario = _scenario(protocol={"batch_size": 16})
    first = pretrain(scenario, tmp_path / "a.pt", epochs=8)
    second = pretrain(scenario, tmp_path / "b.pt", epochs=8)
    assert first.epochs[-1].test_accuracy > 0.3  # ten classes: chance is 0.1
    a, b = (torch.load(path, weights_only=True) for path in (tmp_path / "a.pt", tmp_path / "b.pt"))
    assert set(a) == {"encoder", "head", "pretrain"} and a["pretrain"]["pool_images"] == first.pool_images
    assert all(torch.equal(a["encoder"][key], b["encoder"][key]) for key in a["encoder"])


def test_a_run_loads_the_weights_and_records_their_origin(tmp_path: Path) -> None:
    weights = tmp_path / "pool.pt"
    pretrain(_scenario(), weights, epochs=1)
    scenario = _scenario(model={"encoder": "small_cnn", "width": 8, "feature_dim": 32, "pretrained": str(weights)}, algorithm={"name": "fedavg"}, protocol={"rounds": 1})
    run_simulation(prepare_run(scenario), tmp_path / "run", QuietObserver())
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    origin = manifest["initialisation"]
    assert origin["encoder"] == "pretrained" and origin["file"] == str(weights.resolve()) and len(origin["sha256"]) == 64
    assert origin["pretrain"]["pretrain_pool"] == 0.25 and origin["pretrain"]["epochs"] == 1


def test_a_run_that_would_put_the_pool_back_is_refused(tmp_path: Path) -> None:
    weights = tmp_path / "pool.pt"
    pretrain(_scenario(), weights, epochs=1)
    model = {"encoder": "small_cnn", "width": 8, "feature_dim": 32, "pretrained": str(weights)}
    leaking = build_scenario(tiny_scenario(dataset={"name": "digits"}, model=model))
    with pytest.raises(ScenarioError, match=r"dataset\.pretrain_pool: 0\.25.*this scenario has dataset\.pretrain_pool: null"):
        prepare_run(leaking)
    other_seed = build_scenario(tiny_scenario(dataset={"name": "digits", **POOL}, model=model, seed=8))
    with pytest.raises(ScenarioError, match=r"pretrained at seed 7.*--set seed=8"):
        prepare_run(other_seed)


def test_the_command_without_a_pool_names_the_key(tmp_path: Path, write_scenario) -> None:
    path = write_scenario(tiny_scenario())
    result = CliRunner().invoke(app, ["pretrain", str(path), "--out", str(tmp_path / "w.pt"), "--epochs", "1"])
    assert result.exit_code == 2 and "dataset.pretrain_pool" in result.output and not (tmp_path / "w.pt").exists()
    result = CliRunner().invoke(app, ["pretrain", str(path), "--out", str(tmp_path / "w.pt"), "--epochs", "1", "--set", "dataset.pretrain_pool=0.25"])
    assert result.exit_code == 0, result.output
    assert "epoch 1/1" in result.output and (tmp_path / "w.pt").is_file()


def test_bad_epochs_and_a_folder_for_out_are_refused_before_training(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="--epochs: 0"):
        pretrain(_scenario(), tmp_path / "w.pt", epochs=0)
    with pytest.raises(ScenarioError, match="this is a folder"):
        pretrain(_scenario(), tmp_path, epochs=1)
