"""Summaries of the per-client accuracy distribution that the paper's tables
report: mean, worst, bottom-20% mean, best, and the best-minus-worst gap."""

from __future__ import annotations

import numpy as np


def client_accuracy_summary(accuracies: np.ndarray) -> dict[str, float]:
    """{mean, worst, bottom20, best, gap} of client accuracies (fractions in [0, 1]).

    bottom20 is the mean of the lowest ceil(K / 5) accuracies, at least one.
    NaN entries (clients not evaluated) are left out; all NaN if none is left."""
    values = np.asarray(accuracies, dtype=np.float64)
    if values.ndim != 1:
        raise ValueError(f"accuracies must be a 1-D array, got shape {values.shape}")
    values = values[np.isfinite(values)]
    if values.size == 0:
        return {key: float("nan") for key in ("mean", "worst", "bottom20", "best", "gap")}
    if np.any((values < 0) | (values > 1)):
        raise ValueError(f"accuracies must be fractions in [0, 1], got {values.tolist()}")
    ordered = np.sort(values)
    # ceil(K / 5) in exact integer arithmetic, with no float rounding to trust.
    tail_size = max(1, (ordered.size + 4) // 5)
    worst, best = float(ordered[0]), float(ordered[-1])
    return {
        "mean": float(np.mean(ordered)),
        "worst": worst,
        "bottom20": float(np.mean(ordered[:tail_size])),
        "best": best,
        "gap": best - worst,
    }
