"""The per-batch conversion from stored uint8 images to the float tensors a model reads."""

from __future__ import annotations

import numpy as np
import torch

from hdcfl_ray.data.shifts import Shift, apply_shift

# (x / 255 - 0.5) / 0.5 folded into one multiply-add: every channel has mean 0.5, std 0.5.
_SCALE = 2.0 / 255.0
_SHIFT = -1.0
# the value a black pixel (0) takes in a float batch
BLACK = 0.0 * _SCALE + _SHIFT


def as_shift(shift: float | Shift) -> Shift:
    """A client's shift as stored (a number is a rotation in degrees) as a Shift."""
    return shift if isinstance(shift, Shift) else Shift("rotation", float(shift))


def to_float_batch(images: np.ndarray | torch.Tensor, shift: float | Shift = 0.0, seed: int = 0) -> torch.Tensor:
    """uint8 (B, H, W, C) -> float32 (B, C, H, W) in [-1, 1], with the client's feature shift.

    A number is a rotation counter-clockwise in degrees: multiples of 90 degrees
    rotate exactly (pixels move, none are interpolated); other angles are bilinear
    with black corners. `seed` seeds a shift that draws noise. A tensor input stays
    on its device.
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
    batch = apply_shift(batch, as_shift(shift), seed)
    return batch.mul_(_SCALE).add_(_SHIFT)


def shift_uint8(images: np.ndarray, shift: float | Shift = 0.0, seed: int = 0) -> np.ndarray:
    """uint8 (B, H, W, C) shifted like `to_float_batch` shifts them, kept as uint8 (B, H, W, C).

    For methods that read raw pixels (PACFL's data subspaces): no normalisation,
    no augmentation, the client's shift applied."""
    if images.dtype != np.uint8 or images.ndim != 4:
        raise ValueError(f"shift_uint8 expects uint8 (B, H, W, C) images, got {images.dtype} {images.shape}")
    shift = as_shift(shift)
    if shift.transform == "rotation" and abs(shift.level % 360.0) < 1e-9 or shift.is_identity():
        return np.ascontiguousarray(images)
    batch = torch.from_numpy(images.astype(np.float32)).permute(0, 3, 1, 2).contiguous()
    shifted = apply_shift(batch, shift, seed).round_().clamp_(0, 255).to(torch.uint8)
    return shifted.permute(0, 2, 3, 1).contiguous().numpy()
