"""The GPU path end to end, for a machine with CUDA: `python -m pytest -m cuda`.

Every method x {small CNN, ResNet-18}, two rounds on synthetic data, through Ray
with `runtime.num_gpus_per_actor: 0.25` (four hosts per GPU). Each case checks
that the hosts trained on CUDA (the manifest's device and GPU name), that every
metric is finite, that two GPU runs give the same bits (deterministic cuDNN and
cuBLAS, no TF32) and that the GPU's round-1 numbers are within tolerance of a CPU
run of the same scenario (CPU and GPU kernels round differently, so not
bit-equal). Skipped on a machine without CUDA; CI never runs it. The CPU reference
runs dominate its time; `-k small_cnn` and `-k resnet18` split it in two.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from hdcfl_ray.algorithms.registry import method_names
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.logs.table_writer import read_table
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.terminal.live_view import QuietObserver
from tests.conftest import SMALL_FEDERATION_METHODS

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (python -m pytest -m cuda on a GPU machine)"),
]

COLUMNS = ("round", "client_id", "accuracy", "loss", "train_loss")
# CPU and GPU runs of the same scenario after round 1 (before rounding differences have
# compounded over rounds): mean accuracy within 10 points, mean loss within 20%
ACCURACY_TOLERANCE = 0.10
LOSS_TOLERANCE = 0.20
ENCODERS = {
    "small_cnn": {"encoder": "small_cnn", "width": 8, "feature_dim": 32},
    "resnet18_cifar": {"encoder": "resnet18_cifar"},
}


def _scenario(method: str, model: dict[str, Any], gpus: float, out: Path) -> dict[str, Any]:
    return {
        "name": "cuda-smoke",
        "seed": 7,
        "dataset": {"name": "synthetic", "image_size": 16, "channels": 3, "num_classes": 4, "train_samples": 320, "test_samples": 80},
        "partition": {"kind": "rotation", "num_clients": 8, "angles": [0, 180], "test_per_client": 10},
        "model": model,
        "algorithm": {"name": method, **SMALL_FEDERATION_METHODS},
        "protocol": {"rounds": 2, "participation": 1.0, "local_epochs": 1, "batch_size": 32},
        "runtime": {"backend": "ray", "clients_per_actor": 2, "num_cpus_per_actor": 0.5, "num_gpus_per_actor": gpus},
        "checkpoint": {"every": None},
        "output": {"dir": str(out)},
    }


def _run(method: str, encoder: str, gpus: float, run_dir: Path) -> tuple[list[tuple], dict[str, Any]]:
    scenario = build_scenario(_scenario(method, ENCODERS[encoder], gpus, run_dir.parent))
    run_simulation(prepare_run(scenario), run_dir, QuietObserver())
    clients = read_table(run_dir, "clients").to_pydict()
    rows = sorted(zip(*(clients[column] for column in COLUMNS)))
    return rows, json.loads((run_dir / "manifest.json").read_text())


def _means(rows: list[tuple], round_index: int) -> tuple[float, float]:
    scored = [row for row in rows if row[0] == round_index]
    return sum(row[2] for row in scored) / len(scored), sum(row[3] for row in scored) / len(scored)


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("encoder", sorted(ENCODERS))
@pytest.mark.parametrize("method", method_names())
def test_method_on_gpu_hosts(tmp_path: Path, method: str, encoder: str) -> None:
    first, manifest = _run(method, encoder, 0.25, tmp_path / "gpu-1")
    hosts = manifest["client_host_hardware"]
    assert hosts and all(host["device"].startswith("cuda") and host["gpu_name"] for host in hosts), hosts
    assert all(host["cuda_deterministic"] is True and host["cuda_tf32"] is False for host in hosts)
    assert all(math.isfinite(value) for row in first for value in row[2:4]), "non-finite accuracy or loss"
    second, _ = _run(method, encoder, 0.25, tmp_path / "gpu-2")
    assert second == first, "two GPU runs of the same scenario and seed differ"
    cpu, cpu_manifest = _run(method, encoder, 0.0, tmp_path / "cpu")
    assert all(host["device"] == "cpu" for host in cpu_manifest["client_host_hardware"])
    (gpu_accuracy, gpu_loss), (cpu_accuracy, cpu_loss) = _means(first, 1), _means(cpu, 1)
    assert abs(gpu_accuracy - cpu_accuracy) <= ACCURACY_TOLERANCE, (gpu_accuracy, cpu_accuracy)
    assert abs(gpu_loss - cpu_loss) <= LOSS_TOLERANCE * abs(cpu_loss), (gpu_loss, cpu_loss)


def test_local_training_on_cuda_reads_the_device_once_per_epoch() -> None:
    from hdcfl_ray.config.schema import ModelConfig, OptimizerConfig
    from hdcfl_ray.models import build_split_model
    from hdcfl_ray.training.local_training import evaluate, train_locally

    device = torch.device("cuda", 0)
    model = build_split_model(ModelConfig(encoder="small_cnn", width=8, feature_dim=16), in_channels=3, num_classes=4, seed=0).to(device)
    inputs = torch.randn(256, 3, 16, 16, device=device)
    labels = torch.randint(0, 4, (256,), device=device)
    optimizer = OptimizerConfig(name="sgd", lr=0.05, momentum=0.9, weight_decay=5e-4)
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            train_locally(model, inputs, labels, epochs=2, batch_size=32, optimizer_config=optimizer, generator=torch.Generator().manual_seed(0))
            evaluate(model, inputs, labels, batch_size=32)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in seen if "synchroniz" in str(w.message).lower()]
    # per epoch: the batch order's copy to the device and the finite flag; once: the loss; evaluation: accuracy and loss
    assert len(syncs) <= 2 * 2 + 1 + 2, [str(w.message) for w in syncs]
