"""Weighted averaging of flat parameter vectors: the one aggregation rule that
FedAvg's global encoder and HDC-FL's encoder prototypes share.

Both the global encoder and the single-group prototype go through this function
in the same client order, so with full participation they agree bit for bit
(spec/hdcfl.md, section 2).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def weighted_average(vectors: Sequence[np.ndarray] | np.ndarray, weights: Sequence[float]) -> np.ndarray:
    """Return sum_k w_k v_k / sum_k w_k as float32.

    `vectors` is a sequence of equally shaped arrays or a stacked array whose first
    axis indexes them. Accumulation is in float64 and runs in the given order, so the
    same inputs in the same order give the same bits on every call.
    """
    weight_array = np.asarray(weights, dtype=np.float64)
    if weight_array.ndim != 1:
        raise ValueError(f"weights must be one number per vector, got shape {weight_array.shape}")
    count = len(vectors)
    if count == 0:
        raise ValueError("weighted_average needs at least one vector, got none")
    if weight_array.shape[0] != count:
        raise ValueError(f"weighted_average got {count} vectors but {weight_array.shape[0]} weights")
    if not np.all(np.isfinite(weight_array)) or np.any(weight_array < 0):
        raise ValueError(f"weights must be finite and non-negative, got {weight_array.tolist()}")
    total = float(np.sum(weight_array))
    if total <= 0.0:
        raise ValueError(f"weights must have a positive total, got {total}")

    shape = np.shape(vectors[0])
    accumulator = np.zeros(shape, dtype=np.float64)
    for index in range(count):
        vector = np.asarray(vectors[index])
        if vector.shape != shape:
            raise ValueError(f"vector {index} has shape {vector.shape}, expected {shape} like vector 0")
        accumulator += (weight_array[index] / total) * vector.astype(np.float64, copy=False)
    return accumulator.astype(np.float32)
