"""Training and scoring loops read the device once per epoch / evaluation, not per
batch (on CUDA every read stalls the GPU), and a loss that turns NaN mid-epoch
still makes the whole update untrusted."""

from __future__ import annotations

import math
from typing import Any, Iterator

import pytest
import torch

from hdcfl_ray.config.schema import ModelConfig, OptimizerConfig
from hdcfl_ray.models import build_split_model
from hdcfl_ray.training.local_training import evaluate, train_locally

READS = ("__bool__", "__float__", "__int__", "item")


@pytest.fixture
def device_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every tensor-to-Python read (each one a host-device sync on CUDA), by name."""
    reads: list[str] = []
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counted(self: torch.Tensor, *args: Any, _original: Any = original, _name: str = name) -> Any:
            reads.append(_name)
            return _original(self, *args)

        monkeypatch.setattr(torch.Tensor, name, counted)
    yield reads


def _model_and_data(samples: int = 96) -> tuple[Any, torch.Tensor, torch.Tensor]:
    model = build_split_model(ModelConfig(encoder="small_cnn", width=4, feature_dim=8), in_channels=1, num_classes=3, seed=0)
    generator = torch.Generator().manual_seed(0)
    return model, torch.randn(samples, 1, 8, 8, generator=generator), torch.randint(0, 3, (samples,), generator=generator)


def test_training_reads_the_device_once_per_epoch(device_reads: list[str]) -> None:
    model, inputs, labels = _model_and_data()
    optimizer = OptimizerConfig(name="sgd", lr=0.05, momentum=0.9, weight_decay=5e-4)
    stats = train_locally(model, inputs, labels, epochs=3, batch_size=8, optimizer_config=optimizer, generator=torch.Generator().manual_seed(1))
    assert stats.steps == 36 and math.isfinite(stats.mean_loss)
    # three epochs of twelve batches: one finite-flag read per epoch and one loss read at the end
    assert len(device_reads) == 3 + 1, device_reads


def test_scoring_reads_the_device_once(device_reads: list[str]) -> None:
    model, inputs, labels = _model_and_data()
    stats = evaluate(model, inputs, labels, batch_size=8, own_classes=torch.tensor([0, 1, 2]))
    assert stats.num_samples == 96 and 0.0 <= stats.accuracy <= 1.0
    assert len(device_reads) == 3, device_reads  # accuracy, own-class accuracy, loss: each read once for twelve batches


def test_a_loss_that_turns_nan_mid_epoch_makes_the_update_untrusted() -> None:
    model, inputs, labels = _model_and_data()
    calls = {"n": 0}

    def poison_after_five(_model: Any) -> torch.Tensor:
        calls["n"] += 1
        return torch.tensor(float("nan") if calls["n"] > 5 else 0.0)

    stats = train_locally(
        model, inputs, labels, epochs=2, batch_size=8, optimizer_config=OptimizerConfig(name="sgd", lr=0.05),
        generator=torch.Generator().manual_seed(1), regulariser=poison_after_five,
    )
    assert stats.nonfinite and math.isnan(stats.mean_loss)  # NaN: the host rejects the upload
    assert calls["n"] == 12  # the first epoch ran to its end; the second never started
