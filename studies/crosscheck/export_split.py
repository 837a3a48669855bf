"""Export one scenario's clients, initial model and hyper-parameters in PFLlib's on-disk form.

Runs in the project's venv. For a scenario and seed it writes

    ROOT/dataset/NAME/train/<client>.npz   {'data': {'x': float32 (N, C, H, W), 'y': int64 (N,)}}
    ROOT/dataset/NAME/test/<client>.npz    the same for the client's test set
    ROOT/dataset/NAME/init.pt              the seeded initial model: {'encoder': state_dict, 'head': state_dict}
    ROOT/dataset/NAME/init_independent.pt  the S further seeded models cluster methods start from (IFCA's clusters):
                                           a list of {'encoder': ..., 'head': ...}
    ROOT/dataset/NAME/crosscheck.json      model sizes and every hyper-parameter the reference run needs
    ROOT/work/                             the reference's working folder (it reads ../dataset/NAME)

The arrays are exactly what hdcfl-ray's clients train and are scored on: the
client's indices in their own order, its rotation applied and the uint8 pixels
mapped to [-1, 1] by `to_float_batch`, as `ClientHost._split_tensors` does.
PFLlib stores each split as a pickled dict inside an .npz; these files are that
format, written by this module only. The settings also record the strides of
each client's tensors as our client host holds them (`layouts`), so that a
paired run can hand the reference's convolutions the same memory layout.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ClientArrays:
    client_id: int
    train_x: np.ndarray  # float32 (N, C, H, W), as the client trains on it
    train_y: np.ndarray  # int64 (N,)
    test_x: np.ndarray
    test_y: np.ndarray


def client_arrays(prepared: Any) -> list[ClientArrays]:
    """Every client's train and test tensors as hdcfl-ray builds them, as numpy arrays."""
    from hdcfl_ray.data.transforms import to_float_batch

    dataset = prepared.dataset
    out = []
    for client in prepared.partition.clients:
        splits = []
        for indices, images, labels in (
            (client.train_indices, dataset.train_images, dataset.train_labels),
            (client.test_indices, dataset.test_images, dataset.test_labels),
        ):
            x = to_float_batch(images[indices], client.rotation_degrees).numpy()
            y = np.asarray(labels[indices], dtype=np.int64)
            splits.append((x, y))
        (train_x, train_y), (test_x, test_y) = splits
        out.append(ClientArrays(client.client_id, train_x, train_y, test_x, test_y))
    return out


def tensor_layouts(prepared: Any) -> dict[str, dict[str, list[int]]]:
    """The strides of each client's train and test tensors as the client host builds
    them (`ClientHost._split_tensors`: `runtime.channels_last` decides the layout).
    The values are the exported arrays'; only the memory layout is recorded, so that
    a paired run can hand the reference's convolutions the same layout."""
    from hdcfl_ray.runtime.backends.local_host import local_host

    host = local_host(prepared)
    return {
        str(client.client_id): {split: list(host._split_tensors(client, split)[0].stride()) for split in ("train", "test")}
        for client in prepared.partition.clients
    }


def resolved_epochs(value: int | None, protocol: Any) -> int:
    """A method's `*_epochs: null` means the protocol's local epochs."""
    return int(protocol.local_epochs if value is None else value)


def reference_settings(prepared: Any) -> dict[str, Any]:
    """What the reference side needs to rebuild the model and run with our protocol."""
    scenario = prepared.scenario
    protocol = scenario.protocol
    if scenario.model.encoder != "small_cnn":
        raise ValueError(f"model.encoder: the cross-check exports small_cnn only, got {scenario.model.encoder!r}")
    if protocol.optimizer.name != "sgd":
        raise ValueError(f"protocol.optimizer.name: the cross-check matches SGD only, got {protocol.optimizer.name!r}")
    if protocol.participation != 1.0:
        raise ValueError("protocol.participation: the cross-check runs full participation (1.0) only")
    algorithm = scenario.algorithm
    babu, ala = algorithm.fedbabu, algorithm.fedala
    ditto, fedrep, apfl, ifca = algorithm.ditto, algorithm.fedrep, algorithm.apfl, algorithm.ifca
    return {
        "scenario": scenario.name,
        "seed": scenario.seed,
        "num_clients": len(prepared.partition.clients),
        "num_classes": prepared.dataset.num_classes,
        "model": {
            "in_channels": prepared.dataset.channels,
            "width": scenario.model.width,
            "feature_dim": scenario.model.feature_dim,
        },
        "rounds": protocol.rounds,
        "local_epochs": protocol.local_epochs,
        "batch_size": protocol.batch_size,
        "lr": protocol.optimizer.lr,
        "momentum": protocol.optimizer.momentum,
        "weight_decay": protocol.optimizer.weight_decay,
        "fedbabu": {
            "finetune_epochs": babu.finetune_epochs,
            "finetune_lr": babu.finetune_lr,
            "finetune_momentum": babu.finetune_momentum,
            "finetune_weight_decay": babu.finetune_weight_decay,
        },
        "fedala": {"layers": ala.layers, "data_fraction": ala.data_fraction, "eta": ala.eta},
        "fedprox": {"mu": algorithm.fedprox.mu},
        "ditto": {
            "proximal": ditto.proximal,
            "personal_epochs": resolved_epochs(ditto.personal_epochs, protocol),
            # absent (None) where our Ditto has no selection rule yet: it then always uses `proximal`
            "lambda_selection": getattr(ditto, "lambda_selection", None),
        },
        "fedrep": {"head_epochs": fedrep.head_epochs, "body_epochs": resolved_epochs(fedrep.body_epochs, protocol)},
        "apfl": {"alpha_init": apfl.alpha_init, "alpha_lr": apfl.alpha_lr, "adaptive": apfl.adaptive},
        "ifca": {"clusters": ifca.clusters, "assignment_samples": ifca.assignment_samples},
        "scaffold": {"server_lr": algorithm.scaffold.server_lr},
        "train_samples": [int(len(c.train_indices)) for c in prepared.partition.clients],
        "layouts": tensor_layouts(prepared),
    }


def independent_states(prepared: Any, count: int) -> list[dict[str, Any]]:
    """The `count` further seeded models the driver gives cluster methods
    (runtime/initial_model.py `independent_initialisations`), as state dicts."""
    from hdcfl_ray import seeding
    from hdcfl_ray.models import build_split_model

    scenario, dataset = prepared.scenario, prepared.dataset
    states = []
    for index in range(count):
        model = build_split_model(
            scenario.model, in_channels=dataset.channels, num_classes=dataset.num_classes,
            seed=seeding.model_init_seed(scenario.seed, index + 1),
        )
        states.append({"encoder": model.encoder.state_dict(), "head": model.head.state_dict()})
    return states


def write_npz(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as handle:
        np.savez_compressed(handle, data={"x": x, "y": y})


def export(scenario_path: str | Path, overrides: list[str], root: Path, name: str = "hdcfl") -> Path:
    """Write the scenario's split, initial model and settings under `root`; returns the dataset folder."""
    import torch

    from hdcfl_ray.config.loading import load_scenario
    from hdcfl_ray.models import build_split_model
    from hdcfl_ray.runtime.driver import prepare_run

    prepared = prepare_run(load_scenario(scenario_path, overrides))
    folder = root / "dataset" / name
    for arrays in client_arrays(prepared):
        write_npz(folder / "train" / f"{arrays.client_id}.npz", arrays.train_x, arrays.train_y)
        write_npz(folder / "test" / f"{arrays.client_id}.npz", arrays.test_x, arrays.test_y)
    scenario = prepared.scenario
    # The same call the driver makes (runtime/initial_model.py): both sides start from these weights.
    model = build_split_model(
        scenario.model, in_channels=prepared.dataset.channels, num_classes=prepared.dataset.num_classes, seed=scenario.seed
    )
    torch.save({"encoder": model.encoder.state_dict(), "head": model.head.state_dict()}, folder / "init.pt")
    torch.save(independent_states(prepared, scenario.algorithm.ifca.clusters), folder / "init_independent.pt")
    (folder / "crosscheck.json").write_text(json.dumps(reference_settings(prepared), indent=2) + "\n")
    (root / "work").mkdir(parents=True, exist_ok=True)
    return folder
