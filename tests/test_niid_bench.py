"""NIID-Bench's CIFAR-10 row (docs/niid-bench.md): the `niid_cnn` encoder has the reference
network's layers and parameter count, split into encoder and head, and the scenario and its
sweeps load and pass the preflight. Nothing here reads CIFAR-10: the scenario's data is
replaced by 32x32 synthetic images."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from hdcfl_ray.config.loading import load_scenario
from hdcfl_ray.config.schema import ModelConfig
from hdcfl_ray.data.dataset import ImageDataset
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.models import build_split_model, count_parameters
from hdcfl_ray.models.encoders import check_encoder_reads
from hdcfl_ray.runtime.preflight import prepare_run
from hdcfl_ray.sweeps.grid import expand, read_sweep_file

FOLDER = Path(__file__).resolve().parents[1] / "scenarios" / "niid-bench"
SCENARIO = FOLDER / "cifar10-dir0.5.yaml"
METHODS = ("fedavg", "fedprox", "scaffold", "fednova")

# The reference network (NIID-Bench's SimpleCNN, Flower's niid_bench models.CNN with input_dim 400
# and hidden_dims [120, 84]) for 3 channels and 10 classes, layer by layer: weight shape, bias size.
REFERENCE_ENCODER = {
    "conv1": ((6, 3, 5, 5), 6),
    "conv2": ((16, 6, 5, 5), 16),
    "fc1": ((120, 16 * 5 * 5), 120),
    "fc2": ((84, 120), 84),
}
REFERENCE_HEAD = ((10, 84), 10)  # the reference's fc3


def layer_count(weight_shape: tuple[int, ...], bias: int) -> int:
    return int(np.prod(weight_shape)) + bias


def niid_cnn(seed: int = 0) -> nn.Module:
    return build_split_model(ModelConfig(encoder="niid_cnn"), in_channels=3, num_classes=10, seed=seed)


def test_niid_cnn_has_the_reference_layers_split_before_the_last_linear_layer() -> None:
    model = niid_cnn()
    shapes = {name: tuple(parameter.shape) for name, parameter in model.encoder.named_parameters()}
    expected = {}
    for layer, (weight, bias) in REFERENCE_ENCODER.items():
        expected[f"{layer}.weight"], expected[f"{layer}.bias"] = weight, (bias,)
    assert shapes == expected
    assert (tuple(model.head.weight.shape), tuple(model.head.bias.shape)) == (REFERENCE_HEAD[0], (REFERENCE_HEAD[1],))
    assert model.feature_dim == model.encoder.feature_dim == 84


def test_niid_cnn_has_the_reference_parameter_count() -> None:
    model = niid_cnn()
    encoder = sum(layer_count(*layer) for layer in REFERENCE_ENCODER.values())
    head = layer_count(*REFERENCE_HEAD)
    assert (count_parameters(model.encoder), count_parameters(model.head)) == (encoder, head) == (61156, 850)
    assert encoder + head == 62006  # the count docs/niid-bench.md quotes


def test_niid_cnn_computes_the_reference_forward_pass() -> None:
    """conv-relu-pool twice, then fc1, fc2 with ReLU and the head: the reference's forward."""
    model = niid_cnn(seed=3)
    model.eval()
    images = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    layers = dict(model.encoder.named_children())
    with torch.no_grad():
        x = F.max_pool2d(F.relu(layers["conv1"](images)), 2)
        x = F.max_pool2d(F.relu(layers["conv2"](x)), 2).reshape(-1, 400)
        x = F.relu(layers["fc2"](F.relu(layers["fc1"](x))))
        expected = model.head(x)
        features = model.encoder(images)
        logits = model(images)
    assert features.shape == (4, 84) and bool((features >= 0).all())
    assert logits.shape == (4, 10)
    torch.testing.assert_close(logits, expected, rtol=0, atol=0)


def tiny_images(side: int, channels: int = 3) -> ImageDataset:
    def split(count: int) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros((count, side, side, channels), np.uint8), np.arange(count, dtype=np.int64) % 2

    train, test = split(4), split(2)
    return ImageDataset("tiny", train[0], train[1], test[0], test[1], ("a", "b"))


def test_niid_cnn_stops_on_images_that_are_not_32x32() -> None:
    check_encoder_reads(ModelConfig(encoder="niid_cnn"), tiny_images(32))
    with pytest.raises(ScenarioError, match=r"niid_cnn .* 32x32 .* holds 8x8 images"):
        check_encoder_reads(ModelConfig(encoder="niid_cnn"), tiny_images(8, channels=1))
    check_encoder_reads(ModelConfig(encoder="small_cnn"), tiny_images(8, channels=1))  # any size


@pytest.fixture
def cifar_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The scenario's data variable, pointed at a folder that holds nothing."""
    folder = str(tmp_path / "cifar10-jpeg")
    monkeypatch.setenv("HDCFL_CIFAR10_PARQUET", folder)
    return folder


def test_the_scenario_holds_the_reference_setting(cifar_variable: str) -> None:
    scenario = load_scenario(SCENARIO)
    assert scenario.name == "niid-bench-c10-dir0_5" and scenario.seed == 42
    assert (scenario.dataset.name, scenario.dataset.path) == ("parquet_images", cifar_variable)
    assert (scenario.dataset.max_train_samples, scenario.dataset.max_test_samples) == (None, None)
    partition = scenario.partition
    assert (partition.kind, partition.num_clients, partition.alpha, partition.min_samples) == ("dirichlet", 10, 0.5, 10)
    assert partition.dirichlet_balance and partition.test_set == "whole_split" and partition.test_per_client is None
    assert scenario.model.encoder == "niid_cnn" and scenario.model.pretrained is None
    assert (scenario.algorithm.name, scenario.algorithm.fedprox.mu, scenario.algorithm.scaffold.server_lr) == ("fedavg", 0.01, 1.0)
    protocol = scenario.protocol
    assert (protocol.mode, protocol.rounds, protocol.participation, protocol.local_epochs, protocol.batch_size) == ("sync", 50, 1.0, 10, 64)
    assert protocol.optimizer.model_dump() == {"name": "sgd", "lr": 0.01, "momentum": 0.9, "weight_decay": 1.0e-5}
    assert protocol.server_optimizer.is_identity and protocol.eval_every == 1


# 32x32 RGB synthetic images in place of CIFAR-10 (each client scored on all 200 test images)
SYNTHETIC = ["dataset.name=synthetic", "dataset.image_size=32", "dataset.train_samples=1000", "dataset.test_samples=200",
             "protocol.rounds=2"]


@pytest.mark.parametrize("method", METHODS)
def test_every_method_of_the_comparison_passes_the_preflight(cifar_variable: str, method: str) -> None:
    prepared = prepare_run(load_scenario(SCENARIO, [*SYNTHETIC, f"algorithm.name={method}"]))
    assert prepared.scenario.algorithm.name == method and prepared.scenario.model.encoder == "niid_cnn"
    assert len(prepared.partition.clients) == 10


def test_the_sweeps_run_five_methods_at_three_seeds(cifar_variable: str) -> None:
    plain, fedadam = (expand(read_sweep_file(FOLDER / name, None)) for name in ("sweep.yaml", "sweep-fedadam.yaml"))
    assert {(run.algorithm, run.seed) for run in plain} == {(m, s) for m in METHODS for s in (42, 123, 2026)}
    assert all(run.scenario.protocol.server_optimizer.is_identity and run.scenario.output.label is None for run in plain)
    assert {(run.algorithm, run.seed) for run in fedadam} == {("fedavg", s) for s in (42, 123, 2026)}
    for run in fedadam:
        step = run.scenario.protocol.server_optimizer
        assert (step.name, step.lr, step.beta1, step.beta2, step.tau, step.bias_correction) == ("adam", 0.01, 0.9, 0.99, 1.0e-3, False)
        assert run.scenario.output.label == "fedadam"
    # the FedAdam runs are FedAvg runs of the same setting name: another folder, or they would share run folders
    assert not {run.run_dir for run in plain} & {run.run_dir for run in fedadam}


def test_the_fedadam_sweep_passes_the_preflight(cifar_variable: str) -> None:
    plan = read_sweep_file(FOLDER / "sweep-fedadam.yaml", None)
    prepared = prepare_run(load_scenario(SCENARIO, [*plan.overrides, *SYNTHETIC]))
    assert (prepared.scenario.protocol.server_optimizer.name, prepared.scenario.output.label) == ("adam", "fedadam")
