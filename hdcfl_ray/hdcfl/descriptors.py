"""Head descriptors: the vectors HDC-FL clusters clients by (docs/hdcfl.md, section 1).

A head is the flat vector [W | b]. Every head is first scaled to unit norm, so a
descriptor depends on a head's direction only, never on its scale. The low-rank
descriptor is the normalised PCA score of the centred heads; the "raw" ablation
uses the unit-normalised heads themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Descriptors:
    """One descriptor per client, in the order the heads were given.

    `effective_rank` is the number of descriptor coordinates: r_eff for the
    low-rank descriptor, the head length for the raw one."""

    vectors: np.ndarray  # (K, effective_rank) float64
    effective_rank: int
    # low-rank only: what maps any head to its descriptor (`describe_head`): the mean of the
    # unit heads the descriptors were centred by, and the principal directions (one column
    # per coordinate, signs fixed as the descriptors' own), so that y = (unit(h) - mean) @ axes
    head_mean: np.ndarray | None = None  # (head length,) float64
    axes: np.ndarray | None = None  # (head length, effective_rank) float64


def unit_normalise(heads: np.ndarray) -> np.ndarray:
    """Rows scaled to unit Euclidean norm, in float64; an all-zero row stays zero."""
    stacked = _as_stack(heads, "heads")
    norms = np.linalg.norm(stacked, axis=1, keepdims=True)
    return np.divide(stacked, norms, out=np.zeros_like(stacked), where=norms > 0)


def raw_descriptors(heads: np.ndarray) -> Descriptors:
    """The "raw head" ablation: the unit-normalised flattened heads."""
    vectors = unit_normalise(heads)
    return Descriptors(vectors=vectors, effective_rank=int(vectors.shape[1]))


def lowrank_descriptors(heads: np.ndarray, rank: int) -> Descriptors:
    """Normalised low-rank descriptors z_k = y_k / ||y_k|| with y = X V[:, :r_eff].

    X holds the unit-normalised heads centred across clients and
    r_eff = min(rank, K - 1, numerical rank of X). The SVD goes through the K x K
    Gram matrix X X^T, whose eigenvectors U and eigenvalues S^2 give the scores
    y = U S directly; heads are long (C x d + C) while clients are few.
    """
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 1:
        raise ValueError(f"rank must be a positive integer, got {rank!r}")
    input_eps = _input_epsilon(heads)
    unit_heads = unit_normalise(heads)
    num_clients, head_length = unit_heads.shape
    centred = unit_heads - unit_heads.mean(axis=0, keepdims=True)

    gram = centred @ centred.T
    eigenvalues, eigenvectors = np.linalg.eigh(gram)
    # eigh sorts ascending; principal components come first.
    eigenvalues, eigenvectors = eigenvalues[::-1], eigenvectors[:, ::-1]
    numerical_rank = _numerical_rank(eigenvalues, num_clients, head_length, input_eps)
    effective_rank = min(int(rank), num_clients - 1, numerical_rank)

    scores = eigenvectors[:, :effective_rank] * np.sqrt(eigenvalues[:effective_rank])
    signs = _sign_flips(scores)
    scores = scores * signs
    norms = np.linalg.norm(scores, axis=1, keepdims=True)
    # A client exactly at the mean head has no direction; it keeps a zero descriptor.
    vectors = np.divide(scores, norms, out=np.zeros_like(scores), where=norms > 0)
    # V = X^T U S^-1: the right singular vectors, so that X V = U S = the scores of the heads above
    axes = (centred.T @ eigenvectors[:, :effective_rank]) / np.sqrt(eigenvalues[:effective_rank]) * signs
    return Descriptors(vectors=vectors, effective_rank=effective_rank, head_mean=unit_heads.mean(axis=0), axes=axes)


def describe_head(descriptors: Descriptors, head: np.ndarray) -> np.ndarray:
    """The descriptor of any head (a newcomer's) in the space of `descriptors`: the unit
    head, centred and projected as the descriptors' heads were, normalised again; for a
    head among them, its own descriptor up to rounding. Raw descriptors: the unit head."""
    unit = unit_normalise(np.asarray(head).reshape(1, -1))[0]
    if descriptors.axes is None or descriptors.head_mean is None:
        return unit
    projected = (unit - descriptors.head_mean) @ descriptors.axes
    norm = float(np.linalg.norm(projected))
    return projected / norm if norm > 0 else np.zeros_like(projected)


def _as_stack(array: np.ndarray, name: str) -> np.ndarray:
    stacked = np.asarray(array, dtype=np.float64)
    if stacked.ndim != 2 or stacked.shape[0] == 0 or stacked.shape[1] == 0:
        raise ValueError(f"{name} must be a non-empty (clients, length) array, got shape {stacked.shape}")
    if not np.all(np.isfinite(stacked)):
        raise ValueError(f"{name} contain NaN or infinite entries")
    return stacked


def _input_epsilon(heads: np.ndarray) -> float:
    """Rounding unit of the heads as stored: float32 heads cannot resolve
    directions finer than float32 rounding, however precise the maths after."""
    dtype = np.asarray(heads).dtype
    return float(np.finfo(dtype).eps) if np.issubdtype(dtype, np.floating) else float(np.finfo(np.float64).eps)


def _numerical_rank(eigenvalues: np.ndarray, num_clients: int, head_length: int, input_eps: float) -> int:
    """Count the singular values of X = sqrt(Gram eigenvalues) that are not rounding noise.

    Two floors, the larger wins: numpy's matrix_rank rule s_i > s_max * max(K, D) * eps
    with the heads' own eps, and the accuracy of the Gram route itself, whose
    eigenvalues carry an error of about K * max(K, D) * eps64 * lambda_max. A third,
    absolute floor treats heads that differ only by rounding as identical (rank 0)."""
    largest = float(eigenvalues[0]) if eigenvalues.size else 0.0
    if largest <= 0.0:
        return 0
    size = max(num_clients, head_length)
    relative_floor = max((size * input_eps) ** 2, num_clients * size * float(np.finfo(np.float64).eps))
    threshold = max(largest * relative_floor, input_eps**2)
    return int(np.count_nonzero(eigenvalues > threshold))


def _sign_flips(scores: np.ndarray) -> np.ndarray:
    """+1 or -1 per component, so that each component's largest-magnitude score is
    positive: an eigenvector's sign is arbitrary, and descriptors must not flip between runs."""
    if scores.shape[1] == 0:
        return np.ones(0)
    pivots = np.argmax(np.abs(scores), axis=0)
    signs = np.sign(scores[pivots, np.arange(scores.shape[1])])
    signs[signs == 0] = 1.0
    return signs
