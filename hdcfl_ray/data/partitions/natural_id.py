"""The natural partition (`partition.kind: natural_id`): clients are the people who made
the data (FEMNIST's writers, Shakespeare's speaking roles, a user), not a cut of pooled
data. `num_clients x ids_per_client` ids are chosen by seed among those with at least
`min_samples` training samples (and at most `max_samples`, where set); each client holds
every training sample of its ids and is tested on the test samples of the same ids (LEAF's
"sample" split: the source holds out a share of each id's own samples, or reads a test
split where the same ids recur)."""

from __future__ import annotations

import numpy as np

from hdcfl_ray.contract.data import SampleIds, Split


def natural_id_partition(
    ids: SampleIds,
    num_clients: int,
    ids_per_client: int,
    min_samples: int,
    column: str,
    rng: np.random.Generator,
    max_samples: int | None = None,
) -> Split:
    counts = np.bincount(ids.train, minlength=len(ids.names))
    eligible = eligible_ids(ids, min_samples, max_samples)
    wanted = num_clients * ids_per_client
    if eligible.shape[0] < wanted:
        outside = counts.shape[0] - eligible.shape[0]
        raise ValueError(
            f"partition.num_clients: {num_clients} clients x {ids_per_client} ids each need {wanted} ids, and column "
            f"{column!r} holds {eligible.shape[0]} with {size_rule(min_samples, max_samples)} ({outside} of its "
            f"{counts.shape[0]} ids have {'fewer' if max_samples is None else 'fewer or more'}); set partition.num_clients "
            f"to at most {eligible.shape[0] // ids_per_client}, or {loosen_rule(max_samples)}, or lower partition.ids_per_client"
        )
    chosen = np.sort(id_order(eligible, rng)[:wanted]).reshape(num_clients, ids_per_client)
    train_by_id = _rows_by_id(ids.train, len(ids.names))
    test_by_id = _rows_by_id(ids.test, len(ids.names))
    client_train = tuple(np.sort(np.concatenate([train_by_id[code] for code in row])).astype(np.int64) for row in chosen)
    client_test = tuple(np.sort(np.concatenate([test_by_id[code] for code in row])).astype(np.int64) for row in chosen)
    without_test = [client for client, rows in enumerate(client_test) if rows.shape[0] == 0]
    if without_test:
        names = ", ".join(repr(ids.names[code]) for code in chosen[without_test[0]])
        raise ValueError(
            f"client {without_test[0]} (ids {names} of column {column!r}) has no test samples, nor do "
            f"{len(without_test) - 1} other clients: the test split holds none of their ids; set dataset.test_split: "
            "null to hold out dataset.test_fraction of each id's own samples, or raise partition.min_samples"
        )
    return Split(client_indices=client_train, test_indices=client_test, true_groups=_planted_groups(ids, chosen, client_train))


def eligible_ids(ids: SampleIds, min_samples: int, max_samples: int | None = None) -> np.ndarray:
    """The codes of the ids with at least `min_samples` training samples (and at most
    `max_samples`, where set), ascending."""
    counts = np.bincount(ids.train, minlength=len(ids.names))
    within = counts >= min_samples
    if max_samples is not None:
        within &= counts <= max_samples
    return np.flatnonzero(within)


def size_rule(min_samples: int, max_samples: int | None) -> str:
    """The ids' size rule as an error or a log line says it."""
    if max_samples is None:
        return f"at least partition.min_samples ({min_samples}) training samples"
    return f"partition.min_samples ({min_samples}) to partition.max_samples ({max_samples}) training samples"


def loosen_rule(max_samples: int | None) -> str:
    """What an error advises to let more ids through the size rule."""
    return "lower partition.min_samples" + (" or raise partition.max_samples" if max_samples is not None else "")


def id_order(eligible: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The seeded order the partition takes ids in: the first draw of its training
    stream, so `num_clients: all`'s fraction (client_count.py) takes the same ids."""
    return rng.permutation(eligible)


def _planted_groups(ids: SampleIds, chosen: np.ndarray, client_train: tuple[np.ndarray, ...]) -> tuple[int, ...] | None:
    """Each client's planted group when the source gives its ids one (the play of a
    speaking role): the group of its ids, or with ids of several groups the one that
    holds most of its training samples (the lowest on a tie); None when it gives none."""
    if ids.groups is None:
        return None
    groups = np.asarray(ids.groups, dtype=np.int64)
    if chosen.shape[1] == 1:
        return tuple(int(groups[row[0]]) for row in chosen)
    return tuple(int(np.argmax(np.bincount(groups[ids.train[rows]]))) for rows in client_train)


def _rows_by_id(codes: np.ndarray, num_ids: int) -> list[np.ndarray]:
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(num_ids + 1))
    return [order[bounds[code] : bounds[code + 1]] for code in range(num_ids)]
