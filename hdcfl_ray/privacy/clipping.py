"""Clipping a client's update to an L2 norm: the bound on one client's influence that
client-level differential privacy's noise is calibrated to. An update is a sequence of
arrays (a model's parts) treated as one vector."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def l2_norm(parts: Sequence[np.ndarray]) -> float:
    """The L2 norm of the parts' concatenation (each part flattened), summed in float64."""
    squares = 0.0
    for part in parts:
        flat = np.asarray(part, dtype=np.float64).ravel()
        # einsum, not np.dot: dot goes to the BLAS, whose threads cost a client milliseconds
        # per clip on a busy machine (measured: 3-7 ms against 2 us for 22k values)
        squares += float(np.einsum("i,i->", flat, flat))
    return math.sqrt(squares)


def clip_parts(parts: Sequence[np.ndarray], clip: float) -> tuple[list[np.ndarray], float]:
    """(the parts scaled by min(1, clip / norm) as float32 copies of the same shapes, the
    norm before clipping). An update within the clip, the zero update included, comes
    back unchanged (float32 input bit for bit); a longer one keeps its direction and has
    norm `clip` up to float32 rounding (a relative 1e-7)."""
    if not (math.isfinite(clip) and clip > 0):
        raise ValueError(f"clip: {clip!r} is not a positive finite L2 norm")
    norm = l2_norm(parts)
    if not math.isfinite(norm):
        raise ValueError(f"the update's L2 norm is {norm}: a non-finite update cannot be clipped")
    if norm <= clip:
        return [np.array(part, dtype=np.float32, copy=True) for part in parts], norm
    scale = clip / norm
    return [(np.asarray(part, dtype=np.float64) * scale).astype(np.float32) for part in parts], norm
