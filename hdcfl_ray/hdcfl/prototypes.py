"""Encoder prototypes per group and the personalised encoder mixed from them
(docs/hdcfl.md, sections 3 and 5).

Vectors are flat float32 encoders covering every float entry of the encoder
state; integer buffers are not in them and stay the receiving module's own.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from hdcfl_ray.maths.aggregate import weighted_average


def group_prototypes(
    encoders: np.ndarray | Sequence[np.ndarray], sample_counts: np.ndarray, memberships: np.ndarray, soft: bool
) -> np.ndarray:
    """P_g for every group, as (G, D) float32.

    Hard: the sample-weighted average of the encoders of group g's members, a
    client being a member of the group where its membership row peaks. Soft: all
    cached encoders weighted by pi_kg * n_k.

    A group with no weight (no member, or members with zero samples) falls back
    to the sample-weighted average of all encoders: it has no encoder of its own,
    and the all-client average is what FedAvg would give a client of that group,
    where zeros or NaN would silently wreck its model.

    `encoders` is a (K, D) array or a sequence of K vectors (rows of a disk cache):
    rows are read one at a time, so the resident cost is one row plus one accumulator.
    """
    rows = encoders if isinstance(encoders, np.ndarray) else list(encoders)
    num_clients = len(rows)
    shapes = {np.shape(rows[index]) for index in range(num_clients)} if not isinstance(rows, np.ndarray) else {rows.shape[1:]}
    if num_clients == 0 or len(shapes) != 1 or len(next(iter(shapes))) != 1:
        raise ValueError(
            f"encoders must be a non-empty (clients, length) array or equally long vectors, got shapes {sorted(shapes)[:3]}"
        )
    length = next(iter(shapes))[0]
    counts = np.asarray(sample_counts, dtype=np.float64)
    if counts.shape != (num_clients,) or np.any(counts < 0) or not np.all(np.isfinite(counts)):
        raise ValueError(f"sample_counts must be {num_clients} non-negative numbers, got {counts.tolist()}")
    weights_of = np.asarray(memberships, dtype=np.float64)
    if weights_of.ndim != 2 or weights_of.shape[0] != num_clients or weights_of.shape[1] == 0:
        raise ValueError(f"memberships must be ({num_clients}, groups), got shape {weights_of.shape}")
    if np.any(weights_of < 0) or not np.all(np.isfinite(weights_of)):
        raise ValueError("memberships must be finite and non-negative")

    if soft:
        group_weights = weights_of * counts[:, None]
    else:
        member_group = np.argmax(weights_of, axis=1)
        group_weights = (member_group[:, None] == np.arange(weights_of.shape[1])[None, :]) * counts[:, None]

    prototypes = np.empty((weights_of.shape[1], length), dtype=np.float32)
    for group in range(weights_of.shape[1]):
        column = group_weights[:, group]
        if np.sum(column) > 0:
            # Only clients with weight enter the sum: same bits, less work on long encoders.
            used = np.flatnonzero(column > 0)
            prototypes[group] = weighted_average([rows[index] for index in used], column[used])
        else:
            prototypes[group] = weighted_average(rows, counts)
    return prototypes


def personalised_encoder(global_encoder: np.ndarray, prototypes: np.ndarray, membership_row: np.ndarray, mix: float) -> np.ndarray:
    """phi_k = (1 - mix) * global + mix * sum_g pi_g P_g, as float32.

    The two ends are exact copies, not arithmetic: mix = 0 returns the global
    encoder bit for bit (the lambda = 0 baseline must equal FedAvg-SE), and a
    one-hot row with mix = 1 returns that group's prototype bit for bit.
    """
    global_vector = np.asarray(global_encoder)
    stacked = np.asarray(prototypes)
    row = np.asarray(membership_row, dtype=np.float64)
    if global_vector.ndim != 1:
        raise ValueError(f"global_encoder must be a flat vector, got shape {global_vector.shape}")
    if stacked.ndim != 2 or stacked.shape[1] != global_vector.shape[0]:
        raise ValueError(f"prototypes must be (groups, {global_vector.shape[0]}), got shape {stacked.shape}")
    if row.shape != (stacked.shape[0],):
        raise ValueError(f"membership_row must hold {stacked.shape[0]} weights, got shape {row.shape}")
    if np.any(row < 0) or not np.isclose(np.sum(row), 1.0, atol=1e-6):
        raise ValueError(f"membership_row must be non-negative and sum to 1, got {row.tolist()}")
    if not 0.0 <= mix <= 1.0:
        raise ValueError(f"mix must lie in [0, 1], got {mix!r}")

    if mix == 0:
        return global_vector.astype(np.float32, copy=True)
    if mix == 1 and np.count_nonzero(row) == 1 and np.max(row) == 1.0:
        return stacked[int(np.argmax(row))].astype(np.float32, copy=True)

    mixture = np.zeros(global_vector.shape[0], dtype=np.float64)
    for group in range(stacked.shape[0]):
        if row[group] > 0:
            mixture += row[group] * stacked[group].astype(np.float64, copy=False)
    blended = (1.0 - mix) * global_vector.astype(np.float64, copy=False) + mix * mixture
    return blended.astype(np.float32)
