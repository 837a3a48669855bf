"""NIID-Bench's CIFAR-10 CNN as an encoder: the model behind the field's table.

NIID-Bench (Li, Diao, Chen and He, "Federated Learning on Non-IID Data Silos: An
Experimental Study", ICDE 2022) trains its CIFAR-10 rows with a LeNet-style network
of two 5x5 convolutions (6 and 16 channels, each followed by ReLU and a 2x2 max-pool)
and three fully connected layers 400 -> 120 -> 84 -> 10 with ReLU between them; Flower's
`baselines/niid_bench` reruns it with the same network. Here the last fully connected
layer (84 -> 10) is the client's head, as every model of this project is split
(`split_model.py`), and everything before it is the encoder: its 84 features are the
second hidden layer's activations after its ReLU. Encoder and head together have the
reference network's layers, shapes and parameter count (62,006 for 3 channels and 10
classes), and the same default PyTorch initialisation of each layer.

The flattened size 16 x 5 x 5 = 400 holds for 32x32 inputs only (the reference's MNIST
variant, for 28x28, has 256 inputs to its first linear layer): the preflight refuses
other image sizes (`check_encoder_image_size`).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

# the image side the first linear layer's 400 inputs assume: 32 -> 28 -> 14 -> 10 -> 5
IMAGE_SIDE = 32


class NiidBenchCNN(nn.Module):
    """Encoder: image (B, C, 32, 32) -> 84 features (conv1, conv2, fc1, fc2 of the reference)."""

    feature_dim = 84

    def __init__(self, in_channels: int = 3) -> None:
        super().__init__()
        if in_channels < 1:
            raise ValueError(f"NiidBenchCNN needs in_channels >= 1, got {in_channels}")
        # the reference's layer names, so its weights (without fc3, the head) load by name
        self.conv1 = nn.Conv2d(in_channels, 6, kernel_size=5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, kernel_size=5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, self.feature_dim)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.pool(F.relu(self.conv1(images)))
        features = self.pool(F.relu(self.conv2(features)))
        features = torch.flatten(features, 1)
        features = F.relu(self.fc1(features))
        return F.relu(self.fc2(features))
