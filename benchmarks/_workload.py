"""The set-up the micro-benchmarks share: a CIFAR-shaped split model (3 channels, 10
classes, seed 0) and seeded CIFAR-shaped client data, so that the step, round, GPU and
cache benchmarks time the same model on the same kind of inputs, built one way."""

from __future__ import annotations

from typing import Any

import torch

from hdcfl_ray.config.schema import ModelConfig
from hdcfl_ray.models import build_split_model

CIFAR_SHAPE = (3, 32, 32)
CIFAR_CLASSES = 10


def cifar_model(model: str | dict[str, Any] | ModelConfig, device: torch.device | str = "cpu") -> Any:
    """The split model benchmarks train: an encoder name ("resnet18_cifar"), a model section
    as a dict ({"encoder": "small_cnn", "width": 16}) or a ModelConfig; seed 0."""
    config = model if isinstance(model, ModelConfig) else ModelConfig(encoder=model) if isinstance(model, str) else ModelConfig(**model)
    return build_split_model(config, in_channels=CIFAR_SHAPE[0], num_classes=CIFAR_CLASSES, seed=0).to(device)


def cifar_clients(clients: int, images: int, seed: int = 0, device: torch.device | str = "cpu", uniform: bool = False) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`clients` pairs of (images, labels) drawn in turn from one CPU generator seeded with
    `seed` (standard normal pixels, or uniform in [0, 1) with `uniform`), then moved to
    `device`: the same numbers on every device."""
    generator = torch.Generator().manual_seed(seed)
    draw = torch.rand if uniform else torch.randn
    data = []
    for _ in range(clients):
        inputs = draw(images, *CIFAR_SHAPE, generator=generator)
        labels = torch.randint(0, CIFAR_CLASSES, (images,), generator=generator)
        data.append((inputs.to(device), labels.to(device)))
    return data


def plain_epochs(model: Any, inputs: torch.Tensor, labels: torch.Tensor, optimizer: torch.optim.Optimizer, batch_size: int, epochs: int) -> int:
    """The plain PyTorch loop the simulations are compared with: `epochs` passes over
    (inputs, labels) in a seeded order (seed 0, drawn on the CPU, moved to the inputs'
    device), cross-entropy through the split model, one optimizer step per batch.
    Returns the samples trained; the caller times it (and synchronises a GPU)."""
    generator = torch.Generator().manual_seed(0)
    samples = 0
    for _ in range(epochs):
        order = torch.randperm(inputs.shape[0], generator=generator).to(inputs.device)
        for start in range(0, inputs.shape[0], batch_size):
            batch = order[start : start + batch_size]
            optimizer.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model.head(model.encoder(inputs[batch])), labels[batch])
            loss.backward()
            optimizer.step()
            samples += int(batch.shape[0])
    return samples
