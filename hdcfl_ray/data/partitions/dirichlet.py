"""Dirichlet label-skew partition: each class is spread over clients by Dirichlet(alpha) shares.

This is the "p_k ~ Dir(beta)" partition of NIID-Bench (Li, Diao, Chen and He, "Federated
Learning on Non-IID Data Silos: An Experimental Study", ICDE 2022), alpha being its beta.
For each class in ascending label order the shares p ~ Dir(alpha, ..., alpha) over the
clients are drawn; with `balance` (`partition.dirichlet_balance`, the default) NIID-Bench's
balancing step follows: a client that already holds at least N / num_clients training
samples (N = all training samples) from the classes before gets share 0 of this class and
the others' shares are renormalised to sum to 1. The class's shuffled samples are then cut
at floor(cumsum(p) * class size). Without `balance` the shares are used as drawn (the form
the project's results used before balancing became the default).
"""

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
    balance: bool = True,
) -> TrainSplit:
    """Smaller alpha concentrates each class on fewer clients (more skew).

    Shares are redrawn (all classes anew) until every client has at least `min_samples`;
    after `max_draws` failures a ValueError says which parameter to relax. With `balance`
    no client ends with N / num_clients + one class's size or more samples: a client only
    receives a class while it holds fewer than N / num_clients.
    """
    if min_samples * num_clients > labels.shape[0]:
        raise ValueError(
            f"partition.min_samples = {min_samples} for {num_clients} clients needs {min_samples * num_clients} "
            f"samples, more than the {labels.shape[0]} training samples; lower partition.min_samples "
            f"or partition.num_clients"
        )
    class_members = [rng.permutation(np.flatnonzero(labels == label)) for label in np.unique(labels)]
    class_sizes = [members.shape[0] for members in class_members]
    for _ in range(max_draws):
        # Sizes first, indices only for an accepted draw: rejected draws stay cheap.
        if balance:
            counts = _balanced_counts(class_sizes, num_clients, alpha, labels.shape[0], rng)
        else:
            counts = np.stack([_dirichlet_counts(size, num_clients, alpha, rng) for size in class_sizes])
        if counts is not None and counts.sum(axis=0).min() >= min_samples:
            return TrainSplit(client_indices=_cut(class_members, counts))
    raise ValueError(
        f"no Dirichlet(alpha = {alpha}) draw in {max_draws} gave every one of {num_clients} clients at "
        f"least {min_samples} samples; lower partition.min_samples or raise partition.alpha"
    )


def _dirichlet_counts(size: int, num_clients: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
    proportions = rng.dirichlet(np.full(num_clients, alpha))
    boundaries = np.floor(np.cumsum(proportions) * size).astype(np.int64)
    boundaries[-1] = size
    return np.diff(boundaries, prepend=0)


def _balanced_counts(
    class_sizes: list[int], num_clients: int, alpha: float, total: int, rng: np.random.Generator
) -> np.ndarray | None:
    """One draw of every class's counts with NIID-Bench's balancing step, classes in order.

    A client holding `held` samples is full when held >= total / num_clients (compared as
    held * num_clients >= total, exactly); full clients get share 0. None when every client
    still open drew a share of exactly 0 (underflow at tiny alpha): the draw is rejected.
    """
    held = np.zeros(num_clients, dtype=np.int64)
    rows = []
    for size in class_sizes:
        proportions = rng.dirichlet(np.full(num_clients, alpha))
        proportions = np.where(held * num_clients < total, proportions, 0.0)
        kept = proportions.sum()
        if not kept > 0.0:
            return None
        proportions = proportions / kept
        boundaries = np.minimum(np.floor(np.cumsum(proportions) * size).astype(np.int64), size)
        # from the last client with a positive share on, the cut is the class's end: rounding
        # never hands a sample to a client whose share is 0
        boundaries[int(np.flatnonzero(proportions > 0.0)[-1]) :] = size
        counts = np.diff(boundaries, prepend=0)
        held += counts
        rows.append(counts)
    return np.stack(rows)


def _cut(class_members: list[np.ndarray], counts: np.ndarray) -> tuple[np.ndarray, ...]:
    shares: list[list[np.ndarray]] = [[] for _ in range(counts.shape[1])]
    for members, class_counts in zip(class_members, counts):
        for client, part in enumerate(np.split(members, np.cumsum(class_counts)[:-1])):
            shares[client].append(part)
    return tuple(sorted_int64(np.concatenate(parts)) for parts in shares)
