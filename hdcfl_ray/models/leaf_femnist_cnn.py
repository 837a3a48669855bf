"""LEAF's FEMNIST CNN as an encoder (`model.encoder: leaf_femnist_cnn`).

LEAF (Caldas et al., "LEAF: A Benchmark for Federated Settings", 2018) classifies FEMNIST's
28x28 characters with `models/femnist/cnn.py`: a 5x5 convolution of 32 filters ('same'
padding) with ReLU and a 2x2 max-pool, a 5x5 convolution of 64 filters ('same') with ReLU
and a 2x2 max-pool, the 7 x 7 x 64 features flattened into a dense layer of 2048 with
ReLU, and a dense layer to the 62 classes. Here that last dense layer is the client's
head, as every model of this project is split (`split_model.py`), and everything before
it is the encoder: its 2048 features are the first dense layer's activations after its
ReLU. Encoder and head have LEAF's layers, shapes and parameter count (6,603,710 for one
channel and 62 classes). Weights start at torch's default initialisation, not
TensorFlow's, and the flattened features are in torch's channel-first order.

The flattened size 7 x 7 x 64 holds for 28x28 inputs only: the preflight refuses other
image sizes (`encoders.check_encoder_image_size`).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

# the image side the dense layer's 7 x 7 x 64 inputs assume: 28 -> 14 -> 7
IMAGE_SIDE = 28


class LeafFemnistCNN(nn.Module):
    """Encoder: image (B, C, 28, 28) -> 2048 features (both convolutions and the first dense layer)."""

    feature_dim = 2048

    def __init__(self, in_channels: int = 1) -> None:
        super().__init__()
        if in_channels < 1:
            raise ValueError(f"LeafFemnistCNN needs in_channels >= 1, got {in_channels}")
        # padding 2 keeps a 5x5 convolution's output the size of its input: LEAF's 'same'
        self.conv1 = nn.Conv2d(in_channels, 32, kernel_size=5, padding=2)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=5, padding=2)
        self.dense = nn.Linear(7 * 7 * 64, self.feature_dim)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.pool(F.relu(self.conv1(images)))
        features = self.pool(F.relu(self.conv2(features)))
        return F.relu(self.dense(torch.flatten(features, 1)))
