"""Loss-based soft memberships of FedSoft (plain numpy).

FedSoft scores every local training sample under each of S centres, counts how
many samples each centre explains best (the argmin of the per-sample loss),
smooths the counts so no centre gets weight zero, and normalises them into
importance weights. It then turns the clients' importance weights into
per-centre sampling probabilities over clients (`server_weights`) and draws each
centre's trainers (`select_per_centre`).
"""

from __future__ import annotations

import numpy as np


def argmin_counts(losses: np.ndarray) -> np.ndarray:
    """Per model, the number of samples whose lowest loss is under that model.

    `losses` has shape (S, N): row s holds the per-sample losses under model s.
    Ties go to the lower model index (numpy's argmin), so the counts are exact
    integers summing to N."""
    return np.bincount(sample_assignment(losses), minlength=losses.shape[0]).astype(np.int64)


def sample_assignment(losses: np.ndarray) -> np.ndarray:
    """Each sample's best model: argmin over the model axis of an (S, N) loss array."""
    matrix = np.asarray(losses)
    if matrix.ndim != 2 or matrix.shape[0] == 0:
        raise ValueError(f"losses must have shape (models, samples) with at least one model, got {matrix.shape}")
    return np.argmin(matrix, axis=0).astype(np.int64)


def fill_empty_counts(counts: np.ndarray, smoothing: float) -> np.ndarray:
    """FedSoft's smoother: a model that explains no sample gets sigma * n_k instead of 0."""
    values = np.asarray(counts, dtype=np.float64)
    return np.where(values == 0, smoothing * float(values.sum()), values)


def normalise(weights: np.ndarray) -> np.ndarray:
    """Scale non-negative weights to sum to one; all-zero weights become uniform
    (possible only with sigma = 0 and no samples), so the result is always a
    distribution."""
    values = np.asarray(weights, dtype=np.float64)
    total = float(values.sum())
    if total <= 0.0:
        return np.full(values.shape, 1.0 / values.size)
    return values / total


def importance_weights(counts: np.ndarray, smoothing: float) -> np.ndarray:
    """FedSoft's u_k: smoothed argmin counts over n_k, renormalised to sum to one.

    u_{k,s} = n_{k,s} / n_k alone overshoots one by sigma per empty centre after
    smoothing; the renormalisation removes that (a relative change of at most
    S * sigma) so u_k is a distribution over centres."""
    return normalise(fill_empty_counts(counts, smoothing))


def server_weights(importance: np.ndarray, num_samples: np.ndarray) -> np.ndarray:
    """v_{s,k} = u_{k,s} n_k / sum_j u_{j,s} n_j, shape (S, K): per centre, a
    distribution over clients. `importance` is (K, S), `num_samples` (K,). A
    centre no client gives any weight (only with sigma = 0) gets a zero row."""
    u = np.asarray(importance, dtype=np.float64)
    n = np.asarray(num_samples, dtype=np.float64)
    if u.ndim != 2 or n.shape != (u.shape[0],):
        raise ValueError(f"importance must be (clients, centres) and num_samples (clients,), got {u.shape} and {n.shape}")
    mass = (u * n[:, None]).T  # (S, K)
    totals = mass.sum(axis=1, keepdims=True)
    return np.divide(mass, totals, out=np.zeros_like(mass), where=totals > 0)


def select_per_centre(weights: np.ndarray, per_centre: int, rng: np.random.Generator) -> list[np.ndarray]:
    """For each centre s, `per_centre` distinct clients drawn with probabilities
    weights[s] (sorted ids). Fewer are drawn when fewer clients have a positive
    weight; a centre with no weight at all selects nobody."""
    selections = []
    for row in np.asarray(weights, dtype=np.float64):
        eligible = int(np.count_nonzero(row > 0))
        size = min(per_centre, eligible)
        if size == 0:
            selections.append(np.zeros(0, dtype=np.int64))
            continue
        chosen = rng.choice(row.size, size=size, replace=False, p=row / row.sum())
        selections.append(np.sort(chosen).astype(np.int64))
    return selections
