"""Dirichlet label-skew partition: each class is spread over clients by Dirichlet(alpha) shares."""

from __future__ import annotations

import numpy as np

from hdcfl_ray.data.partitions.train_split import TrainSplit, sorted_int64

MAX_DRAWS = 1000


def dirichlet_partition(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    alpha: float,
    min_samples: int,
    max_draws: int = MAX_DRAWS,
) -> TrainSplit:
    """Smaller alpha concentrates each class on fewer clients (more skew).

    Shares are redrawn until every client has at least `min_samples`; after
    `max_draws` failures a ValueError says which parameter to relax.
    """
    if min_samples * num_clients > labels.shape[0]:
        raise ValueError(
            f"min_samples = {min_samples} for {num_clients} clients needs {min_samples * num_clients} "
            f"samples, more than the {labels.shape[0]} training samples"
        )
    class_members = [rng.permutation(np.flatnonzero(labels == label)) for label in np.unique(labels)]
    for _ in range(max_draws):
        # Sizes first, indices only for an accepted draw: rejected draws stay cheap.
        counts = np.stack([_dirichlet_counts(members.shape[0], num_clients, alpha, rng) for members in class_members])
        if counts.sum(axis=0).min() >= min_samples:
            return TrainSplit(client_indices=_cut(class_members, counts))
    raise ValueError(
        f"no Dirichlet(alpha = {alpha}) draw in {max_draws} gave every one of {num_clients} clients at "
        f"least {min_samples} samples; lower min_samples or raise alpha"
    )


def _dirichlet_counts(size: int, num_clients: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
    proportions = rng.dirichlet(np.full(num_clients, alpha))
    boundaries = np.floor(np.cumsum(proportions) * size).astype(np.int64)
    boundaries[-1] = size
    return np.diff(boundaries, prepend=0)


def _cut(class_members: list[np.ndarray], counts: np.ndarray) -> tuple[np.ndarray, ...]:
    shares: list[list[np.ndarray]] = [[] for _ in range(counts.shape[1])]
    for members, class_counts in zip(class_members, counts):
        for client, part in enumerate(np.split(members, np.cumsum(class_counts)[:-1])):
            shares[client].append(part)
    return tuple(sorted_int64(np.concatenate(parts)) for parts in shares)
