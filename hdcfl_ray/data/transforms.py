"""The per-batch conversion from stored uint8 images to the float tensors a model reads."""

from __future__ import annotations

import numpy as np
import torch

# (x / 255 - 0.5) / 0.5 folded into one multiply-add: every channel has mean 0.5, std 0.5.
_SCALE = 2.0 / 255.0
_SHIFT = -1.0


def to_float_batch(images: np.ndarray | torch.Tensor, rotation_degrees: float = 0.0) -> torch.Tensor:
    """uint8 (B, H, W, C) -> float32 (B, C, H, W) in [-1, 1], rotated counter-clockwise.

    Multiples of 90 degrees rotate exactly (pixels move, none are interpolated);
    other angles are bilinear with black corners. A tensor input stays on its device.
    """
    if images.dtype not in (np.uint8, torch.uint8):
        raise TypeError(f"to_float_batch expects uint8 images, got {images.dtype}")
    if images.ndim != 4:
        raise ValueError(f"to_float_batch expects (B, H, W, C) images, got shape {tuple(images.shape)}")
    if isinstance(images, np.ndarray):
        # astype copies, so read-only arrays from the object store never reach torch.from_numpy.
        batch = torch.from_numpy(images.astype(np.float32))
    else:
        batch = images.to(torch.float32)
    batch = batch.permute(0, 3, 1, 2).contiguous()
    batch = _rotate(batch, rotation_degrees)
    return batch.mul_(_SCALE).add_(_SHIFT)


def _rotate(batch: torch.Tensor, degrees: float) -> torch.Tensor:
    quarter_turns = round(degrees / 90.0)
    if abs(degrees - 90.0 * quarter_turns) < 1e-9:
        if quarter_turns % 4 == 0:
            return batch
        return torch.rot90(batch, quarter_turns % 4, dims=(2, 3))
    # torchvision is imported only here: it adds a second to every actor's start.
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as tvf

    # Rotating raw pixel values makes the fill value 0 mean black, as it would for a photo.
    return tvf.rotate(batch, float(degrees), interpolation=InterpolationMode.BILINEAR, fill=0.0)


def rotate_uint8(images: np.ndarray, rotation_degrees: float = 0.0) -> np.ndarray:
    """uint8 (B, H, W, C) rotated like `to_float_batch` rotates, kept as uint8 (B, H, W, C).

    For methods that read raw pixels (PACFL's data subspaces): no normalisation,
    no augmentation, the client's rotation applied."""
    if images.dtype != np.uint8 or images.ndim != 4:
        raise ValueError(f"rotate_uint8 expects uint8 (B, H, W, C) images, got {images.dtype} {images.shape}")
    if abs(rotation_degrees % 360.0) < 1e-9:
        return np.ascontiguousarray(images)
    batch = torch.from_numpy(images.astype(np.float32)).permute(0, 3, 1, 2).contiguous()
    rotated = _rotate(batch, rotation_degrees).round_().clamp_(0, 255).to(torch.uint8)
    return rotated.permute(0, 2, 3, 1).contiguous().numpy()
