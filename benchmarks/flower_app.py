"""FedAvg on Flower's Ray-based simulation, for benchmarks/vs_flower.py.

Runs in a separate venv holding only flwr[simulation] and torch, so it never
imports hdcfl_ray as a package (no pydantic, pyarrow or hdcfl-ray runtime): the
model file hdcfl_ray/models/small_cnn.py (torch only) is loaded by its path.
The workload comes pre-partitioned in an .npz written by vs_flower.py, so both
simulators train on identical client data.

    python benchmarks/flower_app.py --workload W.npz --rounds 10 --local-epochs 1 --batch-size 32
"""

from __future__ import annotations

import os

# Flower posts a telemetry event at start and exit (and waits for it at exit):
# a benchmark must not depend on the network, so it is off unless asked for.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

import argparse
import importlib.util
import json
import sys
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
from torch import nn

REPO_ROOT = Path(__file__).resolve().parents[1]


def _load_small_cnn_module() -> ModuleType:
    """Load small_cnn.py by file path. `from hdcfl_ray.models.small_cnn import ...`
    would run hdcfl_ray/models/__init__.py, which pulls in pydantic and the config."""
    name = "_hdcfl_small_cnn"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "hdcfl_ray" / "models" / "small_cnn.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


SmallCNN = _load_small_cnn_module().SmallCNN


@dataclass(frozen=True)
class Settings:
    workload: str
    rounds: int
    local_epochs: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    width: int
    feature_dim: int
    seed: int
    num_cpus_per_client: float


# ---- client side: runs inside Flower's Ray actors ----

# One copy of the workload per actor process. This works because Ray imports this
# file as the module `flower_app` in each actor (the client function is pickled by
# reference, see the bottom of the file), so module globals live as long as the actor.
_WORKLOADS: dict[str, dict[str, np.ndarray]] = {}


def _workload(path: str) -> dict[str, np.ndarray]:
    if path not in _WORKLOADS:
        with np.load(path) as archive:
            _WORKLOADS[path] = {key: archive[key] for key in archive.files}
    return _WORKLOADS[path]


def to_inputs(images: np.ndarray) -> torch.Tensor:
    """uint8 (N, H, W, C) -> float32 (N, C, H, W) in [-1, 1], as hdcfl-ray converts."""
    return torch.from_numpy(images.astype(np.float32)).permute(0, 3, 1, 2).contiguous().mul_(2.0 / 255.0).add_(-1.0)


def build_model(in_channels: int, num_classes: int, settings: Settings) -> nn.Module:
    return nn.Sequential(SmallCNN(in_channels, settings.width, settings.feature_dim), nn.Linear(settings.feature_dim, num_classes))


def get_weights(model: nn.Module) -> list[np.ndarray]:
    return [tensor.detach().cpu().numpy().copy() for tensor in model.state_dict().values()]


def set_weights(model: nn.Module, weights: list[np.ndarray]) -> None:
    keys = list(model.state_dict().keys())
    model.load_state_dict({key: torch.from_numpy(np.asarray(w)) for key, w in zip(keys, weights)}, strict=True)


def _numpy_client_class() -> type:
    # Imported lazily so the module imports cheaply wherever only the helpers are used.
    from flwr.client import NumPyClient

    class BenchClient(NumPyClient):
        def __init__(self, settings: Settings, client_id: int) -> None:
            data = _workload(settings.workload)
            self.settings = settings
            self.client_id = client_id
            self.train_images = data[f"train_images_{client_id}"]
            self.train_labels = data[f"train_labels_{client_id}"]
            self.test_images = data[f"test_images_{client_id}"]
            self.test_labels = data[f"test_labels_{client_id}"]
            self.model = build_model(int(self.train_images.shape[3]), int(data["num_classes"]), settings)

        def get_parameters(self, config: dict[str, Any]) -> list[np.ndarray]:
            return get_weights(self.model)

        def fit(self, parameters: list[np.ndarray], config: dict[str, Any]) -> tuple[list[np.ndarray], int, dict[str, Any]]:
            set_weights(self.model, parameters)
            inputs, labels = to_inputs(self.train_images), torch.from_numpy(self.train_labels)
            # Batch order fixed by (seed, client, round), like hdcfl-ray's client generator.
            entropy = np.random.SeedSequence([self.settings.seed, self.client_id, int(config["server_round"])]).generate_state(1)[0]
            generator = torch.Generator().manual_seed(int(entropy))
            optimizer = torch.optim.SGD(
                self.model.parameters(), lr=self.settings.lr, momentum=self.settings.momentum, weight_decay=self.settings.weight_decay
            )
            loss_fn = nn.CrossEntropyLoss()
            self.model.train()
            for _ in range(self.settings.local_epochs):
                order = torch.randperm(inputs.shape[0], generator=generator)
                for start in range(0, inputs.shape[0], self.settings.batch_size):
                    batch = order[start : start + self.settings.batch_size]
                    optimizer.zero_grad(set_to_none=True)
                    loss_fn(self.model(inputs[batch]), labels[batch]).backward()
                    optimizer.step()
            return get_weights(self.model), int(inputs.shape[0]), {}

        @torch.no_grad()
        def evaluate(self, parameters: list[np.ndarray], config: dict[str, Any]) -> tuple[float, int, dict[str, Any]]:
            set_weights(self.model, parameters)
            self.model.eval()
            num = int(self.test_labels.shape[0])
            if num == 0:
                return 0.0, 0, {"accuracy": 0.0}
            logits = self.model(to_inputs(self.test_images))
            labels = torch.from_numpy(self.test_labels)
            loss = float(nn.functional.cross_entropy(logits, labels))
            accuracy = float((logits.argmax(dim=1) == labels).float().mean())
            return loss, num, {"accuracy": accuracy}

    return BenchClient


def client_fn(settings: Settings, context: Any) -> Any:
    """One short-lived client per message, as Flower's simulation expects."""
    # Each actor reserves one CPU; torch's own thread pool would oversubscribe the cores.
    torch.set_num_threads(1)
    client_id = int(context.node_config["partition-id"])
    return _numpy_client_class()(settings, client_id).to_client()


# ---- server side: runs in this process, in a thread Flower starts ----

# The strategy's metric aggregation is the one hook that sees every evaluation
# round; run_simulation returns nothing, so the results are collected here.
_EVAL_ACCURACY: list[float] = []


def weighted_accuracy(results: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    examples = sum(num for num, _ in results)
    accuracy = sum(num * float(metrics["accuracy"]) for num, metrics in results) / max(examples, 1)
    _EVAL_ACCURACY.append(accuracy)
    return {"accuracy": accuracy}


def server_fn(settings: Settings, num_clients: int, in_channels: int, num_classes: int, context: Any) -> Any:
    from flwr.common import ndarrays_to_parameters
    from flwr.server import ServerAppComponents, ServerConfig
    from flwr.server.strategy import FedAvg

    torch.manual_seed(settings.seed)
    initial = get_weights(build_model(in_channels, num_classes, settings))
    strategy = FedAvg(
        fraction_fit=1.0,
        fraction_evaluate=1.0,
        min_fit_clients=num_clients,
        min_evaluate_clients=num_clients,
        min_available_clients=num_clients,
        initial_parameters=ndarrays_to_parameters(initial),
        # The round number seeds each client's batch order.
        on_fit_config_fn=lambda server_round: {"server_round": server_round},
        evaluate_metrics_aggregation_fn=weighted_accuracy,
    )
    return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=settings.rounds))


def parse_args(argv: list[str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", required=True, help=".npz written by benchmarks/vs_flower.py")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--weight-decay", type=float, default=5e-4)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--feature-dim", type=int, default=64)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--num-cpus-per-client", type=float, default=1.0)
    args = parser.parse_args(argv)
    return Settings(**{**vars(args), "workload": str(Path(args.workload).resolve())})


def main(argv: list[str] | None = None) -> None:
    from flwr.client import ClientApp
    from flwr.server import ServerApp
    from flwr.simulation import run_simulation

    settings = parse_args(argv)
    with np.load(settings.workload) as archive:
        num_clients = int(archive["num_clients"])
        num_classes = int(archive["num_classes"])
        in_channels = int(archive["train_images_0"].shape[3])
    run_simulation(
        server_app=ServerApp(server_fn=partial(server_fn, settings, num_clients, in_channels, num_classes)),
        client_app=ClientApp(client_fn=partial(client_fn, settings)),
        num_supernodes=num_clients,
        backend_config={"client_resources": {"num_cpus": settings.num_cpus_per_client, "num_gpus": 0.0}},
    )
    result = {
        "rounds": settings.rounds,
        "num_clients": num_clients,
        "final_mean_accuracy": _EVAL_ACCURACY[-1] if _EVAL_ACCURACY else None,
        "accuracy_per_round": _EVAL_ACCURACY,
        "settings": asdict(settings),
    }
    print("FLOWER_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    # Run through the importable module `flower_app`, not `__main__`: cloudpickle
    # ships functions of `__main__` by value (globals included) with every message,
    # so the per-actor data cache above would start empty for every client call.
    # By reference, each Ray actor imports this file once (Flower passes sys.path,
    # which holds this folder, to its actors as PYTHONPATH).
    import flower_app

    flower_app.main()
