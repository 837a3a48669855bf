"""ResNet-18 in its CIFAR form: a 3x3 stride-1 stem and no max-pool.

The ImageNet stem (7x7 stride 2 plus max-pool) would shrink a 32x32 image to 8x8
before the first residual stage; the CIFAR form keeps the full resolution there.
"""

from __future__ import annotations

import torch
from torch import nn

STAGE_CHANNELS = (64, 128, 256, 512)
BLOCKS_PER_STAGE = 2


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with an identity (or 1x1 projection) shortcut."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet18Cifar(nn.Module):
    """Encoder: image (B, C, H, W) -> 512 features after global average pooling."""

    feature_dim = STAGE_CHANNELS[-1]

    def __init__(self, in_channels: int = 3) -> None:
        super().__init__()
        if in_channels < 1:
            raise ValueError(f"ResNet18Cifar needs in_channels >= 1, got {in_channels}")
        stem_channels = STAGE_CHANNELS[0]
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, stem_channels, kernel_size=3, stride=1, padding=1, bias=False),
            nn.BatchNorm2d(stem_channels),
            nn.ReLU(inplace=True),
        )
        stages: list[nn.Module] = []
        previous = stem_channels
        for stage_index, channels in enumerate(STAGE_CHANNELS):
            first_stride = 1 if stage_index == 0 else 2
            blocks = [BasicBlock(previous, channels, first_stride)]
            blocks += [BasicBlock(channels, channels, 1) for _ in range(BLOCKS_PER_STAGE - 1)]
            stages.append(nn.Sequential(*blocks))
            previous = channels
        self.stages = nn.Sequential(*stages)
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self._init_weights()

    def _init_weights(self) -> None:
        # He initialisation for ReLU networks, as in the original ResNet recipe;
        # PyTorch's default (uniform, a=sqrt(5)) trains noticeably slower here.
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.pool(self.stages(self.stem(images)))
