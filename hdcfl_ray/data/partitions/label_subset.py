"""Label-subset partition (NIID-Bench "#C=k"): every client holds exactly k distinct classes."""

from __future__ import annotations

import numpy as np

from hdcfl_ray.data.partitions.train_split import TrainSplit, sorted_int64


def label_subset_partition(labels: np.ndarray, num_clients: int, rng: np.random.Generator, k: int) -> TrainSplit:
    """Client i holds the classes at positions i*k .. i*k+k-1 (mod C) of a seeded class order.

    Consecutive windows cover every class once k * num_clients >= C and use each
    class about equally often; with fewer clients the classes no one holds are
    left out of training. A class's samples are shuffled and split evenly over
    the clients holding it. True group = rank of the client's class set among the
    distinct sets, so clients with the same classes share a group.
    """
    classes = np.unique(labels)
    num_classes = classes.shape[0]
    if not 1 <= k <= num_classes:
        raise ValueError(f"k = {k} classes per client, but the training labels hold {num_classes} classes")
    class_order = rng.permutation(classes)
    client_classes = [
        tuple(sorted(int(class_order[(client * k + offset) % num_classes]) for offset in range(k)))
        for client in range(num_clients)
    ]

    shares: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for label in classes:
        holders = [client for client, held in enumerate(client_classes) if int(label) in held]
        if not holders:
            continue
        members = np.flatnonzero(labels == label)
        if members.shape[0] < len(holders):
            raise ValueError(
                f"class {int(label)} has {members.shape[0]} training samples but {len(holders)} clients "
                f"hold it; use fewer clients or a smaller k"
            )
        for client, share in zip(holders, np.array_split(rng.permutation(members), len(holders))):
            shares[client].append(share)

    distinct_sets = sorted(set(client_classes))
    return TrainSplit(
        client_indices=tuple(sorted_int64(np.concatenate(parts)) for parts in shares),
        true_groups=tuple(distinct_sets.index(held) for held in client_classes),
    )
