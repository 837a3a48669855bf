"""The scenario key `dataset.augmentation`: training-time augmentation of image batches
(a random crop of the padded image and a random horizontal flip, each sample drawn
anew every step). Its defaults add none, so a scenario without the key trains on the
images as they are. hdcfl_ray/data/augmentation.py applies it; what it refuses for a
dataset (text, padding as wide as the image) is checked there, at preflight."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from hdcfl_ray.contract import Section

# torchvision's name for padding with a fill value (its fill 0: a black pixel) is "constant"
_PADDING_MODE_ALIASES = {"constant": "zeros"}


class AugmentationConfig(Section):
    """Random crop with padding and random horizontal flip, applied to training batches only."""

    crop_padding: int = Field(
        0,
        ge=0,
        strict=True,
        description="pixels added on every side before a random crop back to the image's size (each sample its own "
        "offset in 0..2p per axis; 4 on 32x32 CIFAR-10 is the common recipe); 0 = no crop. Must be less than the "
        "image's side",
    )
    padding_mode: Literal["reflect", "zeros"] = Field(
        "reflect",
        description="what the padding holds: reflect = the image mirrored at its border, without repeating the edge "
        "pixel (torch's and torchvision's reflect); zeros = black pixels (pixel value 0, -1 after the [-1, 1] "
        "normalisation; torchvision's constant padding with fill 0, also accepted as constant)",
    )
    horizontal_flip: bool = Field(False, strict=True, description="mirror each sample left-right with probability 0.5")

    @field_validator("padding_mode", mode="before")
    @classmethod
    def _torchvision_name(cls, value: Any) -> Any:
        return _PADDING_MODE_ALIASES.get(value, value) if isinstance(value, str) else value

    @property
    def active(self) -> bool:
        """Whether it changes any batch (the defaults leave every batch as it is)."""
        return self.crop_padding > 0 or self.horizontal_flip
