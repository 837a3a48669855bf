"""Training-time augmentation (`dataset.augmentation`) of the float batches local training
reads: each sample is cropped at its own random offset out of the image padded by p pixels
on every side, then mirrored left-right with probability 1/2. On the normalised batch this
is what torchvision's `RandomCrop(size, padding=p, padding_mode=...)` followed by
`RandomHorizontalFlip()` does to the [0, 1] image before `Normalize`:

* `reflect` pads with the image mirrored at its border, the edge pixel not repeated;
* `zeros` pads with black pixels: pixel value 0, which is -1 (`transforms.BLACK`) in the
  [-1, 1] batch, as torchvision's constant padding with fill 0 is before normalisation.

Crop and flip only move values (a padded pixel is a copy of an image pixel, or black), so
an augmented batch is the same bits however it is computed: one indexing operation gathers
the whole batch, one client's or several clients' stacked (batched training).

The random draws (`draw`) come from a generator of their own per (run seed, client, round)
(`training_augmentation`), never from the batch-order generator: a run without augmentation
keeps its bits, and the draws do not depend on which path trains the client. Each draw is
one row of a (count, 3) int64 tensor: the crop's row and column offsets into the padded
image (0..2p; p, p is the image itself) and the flip (0 or 1). Offsets are drawn first, then
flips, each only when the settings use it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hdcfl_ray import seeding
from hdcfl_ray.config.augmentation import AugmentationConfig
from hdcfl_ray.data.dataset import ImageDataset
from hdcfl_ray.data.transforms import BLACK
from hdcfl_ray.errors import ScenarioError

DRAW_COLUMNS = 3  # row offset, column offset, flip


def draw(settings: AugmentationConfig, count: int, generator: torch.Generator) -> torch.Tensor:
    """The next `count` samples' draws, (count, 3) int64 on the CPU (module docstring)."""
    draws = torch.zeros((count, DRAW_COLUMNS), dtype=torch.int64)
    if settings.crop_padding > 0:
        draws[:, :2] = torch.randint(0, 2 * settings.crop_padding + 1, (count, 2), generator=generator)
    if settings.horizontal_flip:
        draws[:, 2] = torch.randint(0, 2, (count,), generator=generator)
    return draws


def augment(images: torch.Tensor, draws: torch.Tensor, settings: AugmentationConfig) -> torch.Tensor:
    """`images` (B, C, H, W) cropped and flipped by `draws` (B, 3, on their device): one
    gather of every output pixel from its source pixel, no loop over samples. The result
    has the images' memory format (channels_last stays channels_last, without a copy)."""
    if images.dim() != 4 or draws.shape != (images.shape[0], DRAW_COLUMNS):
        raise ValueError(f"augment expects (B, C, H, W) images and (B, {DRAW_COLUMNS}) draws, got {tuple(images.shape)} and {tuple(draws.shape)}")
    count, channels, height, width = (int(side) for side in images.shape)
    padding = settings.crop_padding
    device = images.device
    # where each output pixel comes from, in the unpadded image's coordinates
    rows = draws[:, 0:1] - padding + torch.arange(height, device=device)
    across = torch.arange(width, device=device)
    cols = draws[:, 1:2] - padding + torch.where(draws[:, 2:3].bool(), width - 1 - across, across)
    outside: torch.Tensor | None = None
    if settings.padding_mode == "reflect":
        rows, cols = _reflected(rows, height), _reflected(cols, width)
    else:
        outside = ((rows < 0) | (rows >= height))[:, :, None] | ((cols < 0) | (cols >= width))[:, None, :]
        rows, cols = rows.clamp(0, height - 1), cols.clamp(0, width - 1)
    # one flat index per output pixel: a single gather (faster on CPU than indexing with a
    # tensor per axis)
    source = (rows[:, :, None] * width + cols[:, None, :]).view(count, height * width)
    channels_last = not images.is_contiguous() and images.is_contiguous(memory_format=torch.channels_last)
    if channels_last:  # (B, H*W, C) is a view of a channels_last batch
        pixels = images.permute(0, 2, 3, 1).reshape(count, height * width, channels)
        out = pixels.gather(1, source[:, :, None].expand(count, height * width, channels))
        if outside is not None:
            out = out.masked_fill(outside.view(count, height * width, 1), BLACK)
        return out.view(count, height, width, channels).permute(0, 3, 1, 2)
    planes = images.reshape(count, channels, height * width)
    out = planes.gather(2, source[:, None, :].expand(count, channels, height * width))
    if outside is not None:
        out = out.masked_fill(outside.view(count, 1, height * width), BLACK)
    return out.view(count, channels, height, width)


def _reflected(index: torch.Tensor, side: int) -> torch.Tensor:
    """Indices of a padded axis (-p .. side-1+p, p < side) mapped into the image by reflecting
    at its border without repeating the edge: -1 -> 1, side -> side - 2."""
    last = side - 1
    return last - (last - index.abs()).abs()


@dataclass
class TrainingAugmentation:
    """A scenario's augmentation with the generator of one client's round: local training
    draws from it step after step, in step order."""

    settings: AugmentationConfig
    generator: torch.Generator

    def draw(self, count: int) -> torch.Tensor:
        """The next `count` samples' draws (CPU)."""
        return draw(self.settings, count, self.generator)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """`images` augmented with the next draws, one per sample."""
        return augment(images, self.draw(int(images.shape[0])).to(images.device), self.settings)


def training_augmentation(settings: AugmentationConfig, seed: int, client_id: int, round_index: int) -> TrainingAugmentation | None:
    """The augmentation of one client's round, its generator fixed by (run seed, client,
    round) alone; None when the settings add none."""
    if not settings.active:
        return None
    generator = torch.Generator()
    generator.manual_seed(seeding.int_seed(seed, "augmentation", client_id, round_index))
    return TrainingAugmentation(settings, generator)


def check_augmentation(settings: AugmentationConfig, dataset: ImageDataset) -> None:
    """Augmentation that cannot apply to `dataset` stops before anything runs: any on text
    (a crop or a flip would scramble the character sequence), and padding as wide as the images."""
    if not settings.active:
        return
    if dataset.text:
        raise ScenarioError(
            f"dataset.augmentation: crops and flips move pixels, and {dataset.name} holds text (character sequences, "
            "not images); remove dataset.augmentation (or set crop_padding: 0 and horizontal_flip: false)"
        )
    height, width = (int(side) for side in dataset.train_images.shape[1:3])
    side = min(height, width)
    if settings.crop_padding >= side:
        raise ScenarioError(
            f"dataset.augmentation.crop_padding: {settings.crop_padding} pixels of padding is not less than the side of "
            f"the {height}x{width} images of {dataset.name}, so a crop could hold no image pixel (and reflect padding "
            f"cannot reflect further than the image); choose 0..{side - 1} (4 is the common choice for 32x32 images)"
        )
