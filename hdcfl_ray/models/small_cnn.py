"""The small convolutional encoder: the CPU default, for 8x8 digits up to 32x32 CIFAR."""

from __future__ import annotations

import torch
from torch import nn


class SmallCNN(nn.Module):
    """Three 3x3 convolutions, one max-pool, a 2x2 adaptive pool and a linear layer.

    No BatchNorm: the encoder state is parameters only, which keeps it fast on a
    CPU and makes averaged encoders behave exactly like their averaged weights.
    The adaptive pool fixes the flattened size at 8 * width whatever the input
    resolution, so the same encoder serves 8x8 and 32x32 images.
    """

    def __init__(self, in_channels: int, width: int = 32, feature_dim: int = 128) -> None:
        super().__init__()
        if in_channels < 1 or width < 1 or feature_dim < 1:
            raise ValueError(
                f"SmallCNN needs positive sizes, got in_channels={in_channels}, width={width}, feature_dim={feature_dim}"
            )
        self.feature_dim = feature_dim
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, 2 * width, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(2 * width, 2 * width, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
        )
        self.projection = nn.Sequential(
            nn.Linear(2 * width * 2 * 2, feature_dim),
            nn.ReLU(inplace=True),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.projection(self.features(images))
