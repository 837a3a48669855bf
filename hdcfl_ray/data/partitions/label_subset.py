"""Label-subset partition ("#C=k"): every client holds exactly k distinct classes.

Two ways to choose which k classes a client holds (`partition.label_assignment`):

* `niid_bench` (the default): the "#C=k" partition of NIID-Bench (Li, Diao, Chen and He,
  "Federated Learning on Non-IID Data Silos: An Experimental Study", ICDE 2022). Client i
  holds class i mod C plus k - 1 other classes drawn uniformly at random without
  replacement, independently for every client, so two clients rarely hold the same set.
* `windows`: one seeded permutation of the classes, client i taking the k classes at
  positions i*k .. i*k + k - 1 (mod C) of it. With 20 clients, k = 3 and C = 10 this gives
  exactly 10 distinct class sets, each held by two clients. The project's results before
  the NIID-Bench form became the default were measured on this form.

Either way a class's samples are shuffled and split evenly (np.array_split, in client
order) over the clients holding it, and a class no client holds is left out of training.
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np

from hdcfl_ray.data.partitions.train_split import TrainSplit, sorted_int64

LabelAssignment = Literal["niid_bench", "windows"]
LABEL_ASSIGNMENTS: tuple[str, ...] = get_args(LabelAssignment)


def label_subset_partition(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    k: int,
    assignment: LabelAssignment = "niid_bench",
) -> TrainSplit:
    """Every client holds exactly k classes, chosen by `assignment` (see the module docstring).

    C counts the classes present in `labels`; "class i mod C" is the (i mod C)-th of them in
    ascending order (class i mod C itself when every class is present). Every draw comes from
    `rng`: first the class sets of all clients, then each class's shuffle in ascending order.

    True group = rank of the client's class set among the distinct sets (sorted), so clients
    holding the same classes share a group and every distinct set is a group of its own.
    """
    classes = np.unique(labels)
    num_classes = classes.shape[0]
    if not 1 <= k <= num_classes:
        raise ValueError(
            f"partition.k = {k} classes per client, but the training labels hold {num_classes} classes "
            f"(choose partition.k 1..{num_classes})"
        )
    if assignment == "niid_bench":
        client_classes = _niid_bench_sets(classes, num_clients, k, rng)
    elif assignment == "windows":
        client_classes = _window_sets(classes, num_clients, k, rng)
    else:
        raise ValueError(
            f"partition.label_assignment: unknown assignment {assignment!r} (choose {' or '.join(LABEL_ASSIGNMENTS)})"
        )

    shares: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for label in classes:
        holders = [client for client, held in enumerate(client_classes) if int(label) in held]
        if not holders:
            continue
        members = np.flatnonzero(labels == label)
        if members.shape[0] < len(holders):
            raise ValueError(
                f"class {int(label)} has {members.shape[0]} training samples but {len(holders)} clients "
                f"hold it (partition.label_assignment {assignment}); lower partition.num_clients or partition.k, "
                f"or keep more training images (dataset.max_train_samples)"
            )
        for client, share in zip(holders, np.array_split(rng.permutation(members), len(holders))):
            shares[client].append(share)

    distinct_sets = sorted(set(client_classes))
    return TrainSplit(
        client_indices=tuple(sorted_int64(np.concatenate(parts)) for parts in shares),
        true_groups=tuple(distinct_sets.index(held) for held in client_classes),
    )


def _niid_bench_sets(
    classes: np.ndarray, num_clients: int, k: int, rng: np.random.Generator
) -> list[tuple[int, ...]]:
    """NIID-Bench's #C=k: class i mod C, then k - 1 distinct others, uniformly at random."""
    num_classes = classes.shape[0]
    sets = []
    for client in range(num_clients):
        own = client % num_classes
        others = rng.choice(np.delete(np.arange(num_classes), own), size=k - 1, replace=False)
        sets.append(tuple(sorted(int(classes[position]) for position in (own, *others.tolist()))))
    return sets


def _window_sets(classes: np.ndarray, num_clients: int, k: int, rng: np.random.Generator) -> list[tuple[int, ...]]:
    """Consecutive windows of k classes over one seeded class order (client i: positions i*k .. i*k+k-1, mod C)."""
    num_classes = classes.shape[0]
    class_order = rng.permutation(classes)
    return [
        tuple(sorted(int(class_order[(client * k + offset) % num_classes]) for offset in range(k)))
        for client in range(num_clients)
    ]
