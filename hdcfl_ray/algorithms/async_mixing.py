"""Server-side maths of asynchronous federation (numpy only).

FedAsync mixes each update as it lands, down-weighted by its staleness;
FedBuff averages B buffered deltas (each relative to the version its client
started from), scaled by their staleness weights, and takes one server step:
x + server_lr x that mean, or protocol.server_optimizer's step on it."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from hdcfl_ray.contract import ServerOptimizerConfig
from hdcfl_ray.maths.server_optimizer import Moments, step_by_delta


def staleness_weight(staleness: int, exponent: float) -> float:
    """Polynomial decay s(tau) = (1 + tau) ** -a; a fresh update (tau = 0) has weight 1."""
    if staleness < 0:
        raise ValueError(f"staleness must be >= 0, got {staleness}")
    return float((1.0 + staleness) ** -exponent)


def fedasync_mix(shared: np.ndarray, update: np.ndarray, mixing: float, staleness: int, exponent: float) -> np.ndarray:
    """x <- (1 - alpha_t) x + alpha_t x_k with alpha_t = mixing * s(staleness)."""
    alpha = mixing * staleness_weight(staleness, exponent)
    mixed = (1.0 - alpha) * shared.astype(np.float64) + alpha * update.astype(np.float64)
    return mixed.astype(np.float32)


def fedbuff_step(
    shared: np.ndarray,
    updates: Sequence[np.ndarray],
    bases: Sequence[np.ndarray],
    stalenesses: Sequence[int],
    exponent: float,
    server_lr: float,
) -> np.ndarray:
    """x <- x + lr * mean_i s(tau_i) (x_i - base_i)."""
    if not updates:
        return shared
    step = _weighted_delta_sum(shared, updates, bases, stalenesses, exponent)
    return (shared.astype(np.float64) + server_lr * step / len(updates)).astype(np.float32)


def fedbuff_optimised_step(
    shared: np.ndarray,
    updates: Sequence[np.ndarray],
    bases: Sequence[np.ndarray],
    stalenesses: Sequence[int],
    exponent: float,
    server_lr: float,
    optimizer: ServerOptimizerConfig,
    moments: Moments,
) -> tuple[np.ndarray, Moments]:
    """FedBuff's step with a server optimiser: its pseudo-gradient is the buffer's
    server_lr * mean_i s(tau_i) (x_i - base_i); the default optimiser gives
    `fedbuff_step` bit for bit. Returns the new vector and the optimiser's moments."""
    if optimizer.is_identity or not updates:
        return fedbuff_step(shared, updates, bases, stalenesses, exponent, server_lr), moments
    delta = server_lr * _weighted_delta_sum(shared, updates, bases, stalenesses, exponent) / len(updates)
    return step_by_delta(optimizer, moments, shared, delta)


def _weighted_delta_sum(
    shared: np.ndarray, updates: Sequence[np.ndarray], bases: Sequence[np.ndarray], stalenesses: Sequence[int], exponent: float
) -> np.ndarray:
    """sum_i s(tau_i) (x_i - base_i), float64."""
    step = np.zeros(shared.shape, dtype=np.float64)
    for update, base, staleness in zip(updates, bases, stalenesses):
        step += staleness_weight(staleness, exponent) * (update.astype(np.float64) - base.astype(np.float64))
    return step
