"""MobileNetV2 encoder adapted to 32x32 inputs, built from torchvision without weights.

The ImageNet network downsamples 32x in total, which leaves a 1x1 map for a
CIFAR image. Making the stem and the first stride-2 inverted-residual stage
stride 1 reduces that to 8x, so the last stages still see a 4x4 map.
"""

from __future__ import annotations

import torch
from torch import nn
from torchvision.models import mobilenet_v2

# torchvision's default table (expansion t, channels c, repeats n, stride s),
# with the second row's stride lowered from 2 to 1.
CIFAR_INVERTED_RESIDUAL_SETTING = [
    [1, 16, 1, 1],
    [6, 24, 2, 1],
    [6, 32, 3, 2],
    [6, 64, 4, 2],
    [6, 96, 3, 1],
    [6, 160, 3, 2],
    [6, 320, 1, 1],
]


class MobileNetV2Cifar(nn.Module):
    """Encoder: image (B, C, H, W) -> 1280 features after global average pooling."""

    feature_dim = 1280

    def __init__(self, in_channels: int = 3) -> None:
        super().__init__()
        if in_channels < 1:
            raise ValueError(f"MobileNetV2Cifar needs in_channels >= 1, got {in_channels}")
        # weights=None: torchvision builds a randomly initialised network and
        # never touches the network.
        network = mobilenet_v2(weights=None, inverted_residual_setting=CIFAR_INVERTED_RESIDUAL_SETTING)
        self.features = network.features
        stem_block = self.features[0]
        imagenet_stem = stem_block[0]
        # The stem is replaced rather than edited so that the stride and the
        # input channels both come from one place.
        cifar_stem = nn.Conv2d(
            in_channels, imagenet_stem.out_channels, kernel_size=3, stride=1, padding=1, bias=False
        )
        nn.init.kaiming_normal_(cifar_stem.weight, mode="fan_out")
        stem_block[0] = cifar_stem
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.pool(self.features(images))
