"""The encoders a scenario can name (`model.encoder`), built freshly initialised.

The split model, the check of a `model.pretrained` file and the model-memory check build theirs here.
"""

from __future__ import annotations

from torch import nn

from hdcfl_ray.config.schema import ModelConfig
from hdcfl_ray.data.dataset import ImageDataset
from hdcfl_ray.errors import ScenarioError
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
    if config.encoder == "char_lstm":
        from hdcfl_ray.models.char_lstm import CharLSTM

        return CharLSTM(feature_dim=config.feature_dim)
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
TEXT_ENCODERS = ("char_lstm",)


def reads_text(encoder: str) -> bool:
    if encoder in TEXT_ENCODERS:
        return True
    from hdcfl_ray.plugins import plugin_specs

    entry = plugin_specs("encoders").get(encoder)
    return entry is not None and bool(getattr(entry[0], "reads_text", False))


def check_encoder_reads(config: ModelConfig, dataset: ImageDataset) -> None:
    """An image encoder on text, or a text encoder on images, stops before anything runs;
    so does an encoder built for one image size (niid_cnn) on images of another."""
    if reads_text(config.encoder) == dataset.text:
        check_encoder_image_size(config, dataset)
        return
    if dataset.text:
        raise ScenarioError(
            f"model.encoder: {config.encoder} reads images, and {dataset.name} holds text (character sequences); "
            f"set model.encoder: {TEXT_ENCODERS[0]}"
        )
    raise ScenarioError(
        f"model.encoder: {config.encoder} reads character sequences, and {dataset.name} holds images; use an image "
        "encoder (small_cnn, resnet18_cifar, mobilenet_v2, niid_cnn) or a text source (dataset.name: text, leaf_json)"
    )


def check_encoder_image_size(config: ModelConfig, dataset: ImageDataset) -> None:
    """niid_cnn flattens 16 x 5 x 5 features into its first linear layer: 32x32 images only."""
    if config.encoder != "niid_cnn" or dataset.text:
        return
    height, width = (int(side) for side in dataset.train_images.shape[1:3])
    if (height, width) != (NIID_CNN_IMAGE_SIDE, NIID_CNN_IMAGE_SIDE):
        raise ScenarioError(
            f"model.encoder: niid_cnn is NIID-Bench's CIFAR-10 CNN, whose first linear layer reads the 16 x 5 x 5 "
            f"features of a {NIID_CNN_IMAGE_SIDE}x{NIID_CNN_IMAGE_SIDE} image, and {dataset.name} holds {height}x{width} "
            "images; use it with 32x32 images (CIFAR-10, or dataset.image_size: 32 for synthetic) or another encoder "
            "(small_cnn reads any size)"
        )
