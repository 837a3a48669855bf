"""The encoders a scenario can name (`model.encoder`), built freshly initialised.

The split model, the check of a `model.pretrained` file and the model-memory check build theirs here.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import nn

from hdcfl_ray.config.schema import ModelConfig
from hdcfl_ray.data.dataset import ImageDataset
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.models.leaf_femnist_cnn import IMAGE_SIDE as LEAF_FEMNIST_CNN_IMAGE_SIDE
from hdcfl_ray.models.leaf_femnist_cnn import LeafFemnistCNN
from hdcfl_ray.models.niid_cnn import IMAGE_SIDE as NIID_CNN_IMAGE_SIDE
from hdcfl_ray.models.niid_cnn import NiidBenchCNN
from hdcfl_ray.models.resnet_cifar import ResNet18Cifar
from hdcfl_ray.models.small_cnn import SmallCNN


def build_encoder(config: ModelConfig, in_channels: int) -> nn.Module:
    """A freshly initialised encoder (draws from the global torch RNG); has a `feature_dim` attribute."""
    if config.encoder == "small_cnn":
        return SmallCNN(in_channels, width=config.width, feature_dim=config.feature_dim)
    if config.encoder == "resnet18_cifar":
        return ResNet18Cifar(in_channels)
    if config.encoder == "niid_cnn":
        return NiidBenchCNN(in_channels)
    if config.encoder == "leaf_femnist_cnn":
        return LeafFemnistCNN(in_channels)
    if config.encoder == "char_lstm":
        from hdcfl_ray.models.char_lstm import CharLSTM

        return CharLSTM(feature_dim=config.feature_dim, embedding_dim=config.embedding_dim, num_layers=config.lstm_layers)
    if config.encoder == "leaf_lstm":
        from hdcfl_ray.models.leaf_lstm import LeafShakespeareLSTM

        return LeafShakespeareLSTM()
    if config.encoder == "mobilenet_v2":
        # imported on use: torchvision adds a second to every actor's start
        from hdcfl_ray.models.mobilenet import MobileNetV2Cifar

        return MobileNetV2Cifar(in_channels)
    from hdcfl_ray.plugins import plugin_specs

    entry = plugin_specs("encoders").get(config.encoder)
    if entry is None:
        raise ValueError(f"unknown encoder {config.encoder!r}")
    encoder = entry[0].build(in_channels, config.feature_dim, config.width)
    if not isinstance(getattr(encoder, "feature_dim", None), int):
        raise TypeError(f"encoder {config.encoder!r}: the module it builds must have an integer feature_dim attribute")
    return encoder


# the built-in encoders that read character sequences (a text source's samples) instead of images
TEXT_ENCODERS = ("char_lstm", "leaf_lstm")


def reads_text(encoder: str) -> bool:
    if encoder in TEXT_ENCODERS:
        return True
    from hdcfl_ray.plugins import plugin_specs

    entry = plugin_specs("encoders").get(encoder)
    return entry is not None and bool(getattr(entry[0], "reads_text", False))


def check_encoder_reads(config: ModelConfig, dataset: ImageDataset) -> None:
    """An image encoder on text, or a text encoder on images, stops before anything runs;
    so does an encoder built for one image size (niid_cnn, leaf_femnist_cnn) on images of another."""
    if reads_text(config.encoder) == dataset.text:
        check_encoder_image_size(config, dataset)
        return
    if dataset.text:
        raise ScenarioError(
            f"model.encoder: {config.encoder} reads images, and {dataset.name} holds text (character sequences); "
            f"set model.encoder: {' or '.join(TEXT_ENCODERS)}"
        )
    raise ScenarioError(
        f"model.encoder: {config.encoder} reads character sequences, and {dataset.name} holds images; use an image "
        "encoder (small_cnn, resnet18_cifar, mobilenet_v2, niid_cnn, leaf_femnist_cnn) or a text source (dataset.name: text, leaf_json)"
    )


class FixedImageSide(NamedTuple):
    """An encoder whose first linear layer assumes one image side, in the words its refusal uses."""

    side: int
    flattened: str  # the features that layer reads
    model: str
    examples: str  # data of that side


FIXED_IMAGE_SIDES = {
    "niid_cnn": FixedImageSide(
        NIID_CNN_IMAGE_SIDE, "16 x 5 x 5", "NIID-Bench's CIFAR-10 CNN", "CIFAR-10, or dataset.image_size: 32 for synthetic"
    ),
    "leaf_femnist_cnn": FixedImageSide(
        LEAF_FEMNIST_CNN_IMAGE_SIDE, "7 x 7 x 64", "LEAF's FEMNIST CNN", "FEMNIST, or dataset.image_size: 28 for synthetic"
    ),
}


def check_encoder_image_size(config: ModelConfig, dataset: ImageDataset) -> None:
    """niid_cnn and leaf_femnist_cnn flatten a fixed number of features into their first linear layer:
    images of one size only."""
    fixed = FIXED_IMAGE_SIDES.get(config.encoder)
    if fixed is None or dataset.text:
        return
    side, flattened, model, examples = fixed
    height, width = (int(length) for length in dataset.train_images.shape[1:3])
    if (height, width) != (side, side):
        raise ScenarioError(
            f"model.encoder: {config.encoder} is {model}, whose first linear layer reads the {flattened} "
            f"features of a {side}x{side} image, and {dataset.name} holds {height}x{width} "
            f"images; use it with {side}x{side} images ({examples}) or another encoder "
            "(small_cnn reads any size)"
        )
