"""PACFL's maths: a client's data subspace, the angles between subspaces and the
one-shot agglomerative clustering on them (docs/baselines.md, PACFL).

Plain numpy/scipy functions on arrays, so they are tested without any runtime.
All angles are in radians; `threshold_in_radians` converts a degree-valued
threshold at the edge.

Choices that deviate from, or pin down, the reference:
- "principal" proximity is the textbook smallest principal angle, arccos of the
  largest singular value of Q_i^T Q_j, where Q is an orthonormal basis (QR) of
  the client's concatenated basis; a per-class concatenation is not orthonormal
  across classes, so it must be orthonormalised first.
- "elementwise" proximity is the reference's min over entries of arccos(U_i^T U_j)
  but on |U_i^T U_j|: singular vectors have arbitrary sign, and without the
  absolute value a flipped vector makes near-identical subspaces look far apart.
- linkage "average" is the reference's rule (the merged row is the arithmetic
  mean of the two merged rows), which is WPGMA, scipy's method "weighted", not
  scipy's size-weighted "average" (UPGMA). "weighted" names the same rule.
"""

from __future__ import annotations

from typing import Callable, Literal, Sequence

import numpy as np

BasisKind = Literal["per_class", "whole"]
ProximityKind = Literal["principal", "elementwise"]

# Config linkage name -> scipy method. The reference's "average" is mean-of-rows (WPGMA).
SCIPY_LINKAGE: dict[str, str] = {"average": "weighted", "weighted": "weighted", "complete": "complete", "single": "single"}


def data_matrix(images: np.ndarray) -> np.ndarray:
    """Raw images (N, H, W, C), uint8 as stored, -> a float64 d x N matrix, one
    column per sample, pixel values 0..255 (no normalisation, as the reference)."""
    count = int(images.shape[0])
    return np.asarray(images, dtype=np.float64).reshape(count, -1).T


def top_left_singular_vectors(matrix: np.ndarray, count: int) -> np.ndarray:
    """The first `count` left singular vectors (fewer if the matrix has fewer columns)."""
    if matrix.shape[1] == 0:
        return np.zeros((matrix.shape[0], 0))
    left, _, _ = np.linalg.svd(matrix, full_matrices=False)
    return left[:, :count]


def client_basis(matrix: np.ndarray, labels: np.ndarray, basis_dim: int, kind: BasisKind) -> np.ndarray:
    """A client's basis U_k (d x m).

    "per_class": for each class present (ascending label order), the top
    `basis_dim` left singular vectors of that class's d x n_c block, concatenated;
    "whole": the top `basis_dim` of the whole d x N matrix."""
    if kind == "whole":
        return top_left_singular_vectors(matrix, basis_dim)
    if kind != "per_class":
        raise ValueError(f"algorithm.pacfl.basis: {kind!r} is not a basis kind (choose per_class or whole)")
    labels = np.asarray(labels)
    blocks = [top_left_singular_vectors(matrix[:, labels == label], basis_dim) for label in np.unique(labels)]
    if not blocks:
        return np.zeros((matrix.shape[0], 0))
    return np.concatenate(blocks, axis=1)


def orthonormal_basis(basis: np.ndarray) -> np.ndarray:
    """An orthonormal basis of the span of `basis`'s columns (reduced QR)."""
    q, _ = np.linalg.qr(basis, mode="reduced")
    return q


def smallest_principal_angle(first: np.ndarray, second: np.ndarray) -> float:
    """arccos of the largest singular value of Q_1^T Q_2, in radians."""
    cosines = np.linalg.svd(orthonormal_basis(first).T @ orthonormal_basis(second), compute_uv=False)
    if cosines.size == 0:
        return float(np.pi / 2)
    return float(np.arccos(np.clip(cosines[0], -1.0, 1.0)))


def elementwise_min_angle(first: np.ndarray, second: np.ndarray) -> float:
    """min over entries of arccos(|U_1^T U_2|), in radians (sign-invariant reference measure)."""
    products = np.abs(first.T @ second)
    if products.size == 0:
        return float(np.pi / 2)
    return float(np.arccos(np.clip(products.max(), 0.0, 1.0)))


def _angle(kind: ProximityKind) -> Callable[[np.ndarray, np.ndarray], float]:
    if kind == "principal":
        return smallest_principal_angle
    if kind == "elementwise":
        return elementwise_min_angle
    raise ValueError(f"algorithm.pacfl.proximity: {kind!r} is not a proximity (choose principal or elementwise)")


def angles_to(basis: np.ndarray, bases: Sequence[np.ndarray], kind: ProximityKind) -> np.ndarray:
    """The angles (radians) between one subspace (a newcomer's) and each of `bases`, by the
    proximity the clustering used."""
    angle = _angle(kind)
    return np.asarray([angle(basis, other) for other in bases], dtype=np.float64)


def proximity_matrix(bases: list[np.ndarray], kind: ProximityKind) -> np.ndarray:
    """Symmetric K x K matrix of angles (radians) between client subspaces, zero diagonal."""
    angle = _angle(kind)
    count = len(bases)
    proximity = np.zeros((count, count))
    for i in range(count):
        for j in range(i + 1, count):
            proximity[i, j] = proximity[j, i] = angle(bases[i], bases[j])
    return proximity


def threshold_in_radians(threshold: float, unit: str) -> float:
    if unit == "radians":
        return float(threshold)
    if unit == "degrees":
        return float(np.deg2rad(threshold))
    raise ValueError(f"algorithm.pacfl.threshold_unit: {unit!r} is not a unit (choose radians or degrees)")


def agglomerative_clusters(proximity: np.ndarray, threshold_radians: float, linkage_name: str) -> np.ndarray:
    """Merge the closest pair of clusters while their linkage distance is <= the
    threshold; return one label per client, numbered by first appearance (the
    cluster of client 0 is 0), so the labelling does not depend on scipy's."""
    if linkage_name not in SCIPY_LINKAGE:
        raise ValueError(f"algorithm.pacfl.linkage: {linkage_name!r} is not supported (choose {', '.join(SCIPY_LINKAGE)})")
    count = int(proximity.shape[0])
    if count <= 1:
        return np.zeros(count, dtype=np.int64)
    from scipy.cluster.hierarchy import fcluster, linkage  # imported on use (slow to import)
    from scipy.spatial.distance import squareform

    tree = linkage(squareform(proximity, checks=False), method=SCIPY_LINKAGE[linkage_name])
    raw = fcluster(tree, t=threshold_radians, criterion="distance")
    first_seen: dict[int, int] = {}
    for label in raw.tolist():
        first_seen.setdefault(int(label), len(first_seen))
    return np.asarray([first_seen[int(label)] for label in raw], dtype=np.int64)


def off_diagonal_summary(proximity: np.ndarray) -> tuple[float, float]:
    """Smallest and median pairwise angle (radians), to calibrate a threshold."""
    upper = proximity[np.triu_indices(proximity.shape[0], k=1)]
    if upper.size == 0:
        return float("nan"), float("nan")
    return float(upper.min()), float(np.median(upper))
