"""The cross-check export (studies/crosscheck/export_split.py) hands the reference exactly
what our clients train and are scored on. No reference code is needed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from hdcfl_ray.config.loading import load_scenario
from hdcfl_ray.models import build_split_model, flatten_module
from hdcfl_ray.runtime.backends.local_host import local_host
from hdcfl_ray.training.local_training import client_generator
from hdcfl_ray.runtime.driver import prepare_run
from hdcfl_ray.runtime.initial_model import independent_initialisations
from tests.conftest import tiny_scenario
from tests.script_modules import REPOSITORY, load_script

CROSSCHECK = REPOSITORY / "studies" / "crosscheck"


def _module(name: str):
    return load_script(CROSSCHECK / f"{name}.py", f"crosscheck_{name}")


def _export_module():
    return _module("export_split")


def _rotated_scenario(write_scenario) -> Path:
    return write_scenario(
        tiny_scenario(
            partition={"kind": "rotation", "num_clients": 8, "angles": [0, 90, 180, 270], "test_per_client": 20},
            algorithm={"name": "fedavg"},
        )
    )


def test_exported_arrays_equal_the_tensors_each_client_trains_and_is_scored_on(write_scenario) -> None:
    export_split = _export_module()
    prepared = prepare_run(load_scenario(_rotated_scenario(write_scenario)))
    host = local_host(prepared)
    exported = export_split.client_arrays(prepared)
    assert [a.client_id for a in exported] == [c.client_id for c in prepared.partition.clients]
    for arrays, client in zip(exported, prepared.partition.clients):
        train_x, train_y = host._split_tensors(client, "train")
        test_x, test_y = host._split_tensors(client, "test")
        assert arrays.train_x.dtype == np.float32 and arrays.train_y.dtype == np.int64
        np.testing.assert_array_equal(arrays.train_x, train_x.cpu().numpy())
        np.testing.assert_array_equal(arrays.train_y, train_y.cpu().numpy())
        np.testing.assert_array_equal(arrays.test_x, test_x.cpu().numpy())
        np.testing.assert_array_equal(arrays.test_y, test_y.cpu().numpy())


def test_export_writes_the_split_the_seeded_initial_model_and_the_protocol(write_scenario, tmp_path: Path) -> None:
    export_split = _export_module()
    scenario_path = _rotated_scenario(write_scenario)
    folder = export_split.export(scenario_path, ["seed=11"], tmp_path / "export")
    prepared = prepare_run(load_scenario(scenario_path, ["seed=11"]))
    expected = export_split.client_arrays(prepared)

    for arrays in expected:
        for split, x, y in (("train", arrays.train_x, arrays.train_y), ("test", arrays.test_x, arrays.test_y)):
            # PFLlib's format is a pickled dict in an .npz; this file was written just above.
            with np.load(folder / split / f"{arrays.client_id}.npz", allow_pickle=True) as stored:
                data = stored["data"].tolist()
            np.testing.assert_array_equal(data["x"], x)
            np.testing.assert_array_equal(data["y"], y)

    state = torch.load(folder / "init.pt", weights_only=True)
    seeded = build_split_model(prepared.scenario.model, in_channels=1, num_classes=10, seed=11)
    for part, module in (("encoder", seeded.encoder), ("head", seeded.head)):
        for key, value in module.state_dict().items():
            assert torch.equal(state[part][key], value), f"{part}.{key}"

    settings = json.loads((folder / "crosscheck.json").read_text())
    host = local_host(prepared)
    for client in prepared.partition.clients:
        for split in ("train", "test"):
            inputs, _ = host._split_tensors(client, split)
            assert settings["layouts"][str(client.client_id)][split] == list(inputs.stride())
    assert settings["train_samples"] == [len(c.train_indices) for c in prepared.partition.clients]

    # the cluster methods' further seeded models, as the driver builds them
    independent = independent_initialisations(prepared.scenario, prepared.dataset, prepared.scenario.algorithm.ifca.clusters)
    states = torch.load(folder / "init_independent.pt", weights_only=True)
    assert len(states) == len(independent)
    for state, params in zip(states, independent):
        model = build_split_model(prepared.scenario.model, in_channels=1, num_classes=10, seed=0)
        model.encoder.load_state_dict(state["encoder"])
        model.head.load_state_dict(state["head"])
        np.testing.assert_array_equal(flatten_module(model.encoder), params.encoder)
        np.testing.assert_array_equal(flatten_module(model.head), params.head)

    assert settings["seed"] == 11
    assert settings["rounds"] == prepared.scenario.protocol.rounds
    assert settings["batch_size"] == prepared.scenario.protocol.batch_size
    assert settings["model"] == {"in_channels": 1, "width": 8, "feature_dim": 32}
    assert (tmp_path / "export" / "work").is_dir()


def test_the_diagnostic_batch_order_is_the_one_our_clients_train_with() -> None:
    # pfllib_side.py imports only torch and numpy at module level; the reference is not needed.
    side = _module("pfllib_side")
    num_samples, batch_size = 71, 8
    for seed, client_id, round_index in ((42, 0, 1), (123, 7, 30), (2026, 19, 12)):
        ours = client_generator(seed, client_id, round_index)
        batches = side.OurBatches(num_samples, batch_size, side.our_batch_generator(seed, client_id, round_index))
        for _epoch in range(2):  # train_locally draws one permutation per epoch from the round's generator
            order = torch.randperm(num_samples, generator=ours)
            expected = [order[start : start + batch_size].tolist() for start in range(0, num_samples, batch_size)]
            assert list(iter(batches)) == expected
        assert len(batches) == 9  # the incomplete last batch is kept, as train_locally keeps it


def test_the_export_carries_each_methods_knobs_as_the_scenario_sets_them(write_scenario, tmp_path: Path) -> None:
    export_split = _export_module()
    scenario_path = _rotated_scenario(write_scenario)
    overrides = [
        "algorithm.fedprox.mu=0.25", "algorithm.ditto.proximal=1.5", "algorithm.ditto.lambda_selection=fixed",
        "algorithm.fedrep.head_epochs=3", "algorithm.apfl.alpha_init=0.3", "algorithm.apfl.alpha_lr=0.05",
        "algorithm.ifca.clusters=3", "algorithm.scaffold.server_lr=0.5",
    ]
    folder = export_split.export(scenario_path, overrides, tmp_path / "export")
    settings = json.loads((folder / "crosscheck.json").read_text())
    epochs = settings["local_epochs"]
    assert settings["fedprox"] == {"mu": 0.25}
    assert settings["ditto"] == {"proximal": 1.5, "personal_epochs": epochs, "lambda_selection": "fixed"}
    assert settings["fedrep"] == {"head_epochs": 3, "body_epochs": epochs}  # null body epochs = the protocol's
    assert settings["apfl"] == {"alpha_init": 0.3, "alpha_lr": 0.05, "adaptive": True}
    assert settings["ifca"]["clusters"] == 3
    assert settings["scaffold"] == {"server_lr": 0.5}
    assert len(torch.load(folder / "init_independent.pt", weights_only=True)) == 3
