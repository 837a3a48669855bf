"""The model every algorithm trains: a shared-able encoder and a client-owned linear head.

The two parts are kept apart because they travel apart: the encoder is
averaged, cached and mixed into prototypes, while each client keeps its own
head, and the head's weights are what HDC-FL describes a client by.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain

import torch
from torch import nn

from hdcfl_ray.config.schema import ModelConfig
from hdcfl_ray.models.encoders import build_encoder
from hdcfl_ray.models.pretrained import load_pretrained_encoder
from hdcfl_ray.models.seeded_rng import global_cpu_rng

logger = logging.getLogger(__name__)


@dataclass
class SplitModel:
    """Encoder (images -> features of size `feature_dim`) followed by `head` (features -> logits)."""

    encoder: nn.Module
    head: nn.Linear

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(images))

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return self.forward(images)

    @property
    def feature_dim(self) -> int:
        return self.head.in_features

    def parameters(self) -> Iterator[nn.Parameter]:
        return chain(self.encoder.parameters(), self.head.parameters())

    def train(self, mode: bool = True) -> "SplitModel":
        self.encoder.train(mode)
        self.head.train(mode)
        return self

    def eval(self) -> "SplitModel":
        return self.train(False)

    def to(self, device: torch.device | str) -> "SplitModel":
        self.encoder.to(device)
        self.head.to(device)
        return self


def build_split_model(config: ModelConfig, in_channels: int, num_classes: int, seed: int) -> SplitModel:
    """Encoder and head initialised from `seed` alone: the same seed gives identical weights.

    The global torch RNG is left as it was, so building a model never shifts
    the data shuffling or dropout streams of the caller.
    """
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    # under the process-wide lock: a parallel sweep builds models in several threads
    with global_cpu_rng(seed):
        encoder = build_encoder(config, in_channels)
        head = nn.Linear(encoder.feature_dim, num_classes)
    if config.pretrained is not None:
        report = load_pretrained_encoder(encoder, config.pretrained)
        if report.missing_keys:
            logger.warning(
                "model.pretrained: '%s' left %d encoder entries at their seeded initial values: %s",
                report.path,
                len(report.missing_keys),
                ", ".join(report.missing_keys),
            )
        if report.unexpected_keys:
            logger.warning(
                "model.pretrained: '%s' has %d entries the encoder does not use: %s",
                report.path,
                len(report.unexpected_keys),
                ", ".join(report.unexpected_keys),
            )
    return SplitModel(encoder=encoder, head=head)


def count_parameters(module: nn.Module) -> int:
    """Number of parameter values (buffers such as BatchNorm statistics are not counted)."""
    return sum(parameter.numel() for parameter in module.parameters())
