"""FedSoft's centre aggregation (plain numpy): c_s = sum_k v_{s,k} w_k over every
client's latest personal model w_k, with v_{s,.} from `fedsoft_importance.server_weights`.

The sum runs over all K clients, not over one round's uploads: a client's w_k
changes only when it trains, so the server's copy of its last upload (or the
shared initial model, before its first one) is its current model. Renormalising
v over the uploads alone would, with the sigma floor giving every client some
weight on every centre, turn a centre none of whose members trained this round
into an average of clients that belong elsewhere.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from hdcfl_ray.maths.aggregate import weighted_average_model
from hdcfl_ray.contract import ModelParams


def starting_models(initial: ModelParams, num_clients: int) -> list[ModelParams]:
    """Every client's w_k before its first upload: one float32 copy of the shared
    initial model, referenced K times (entries are replaced, never written to, so
    the K models take one model's memory until clients upload)."""
    if initial.head is None:
        raise ValueError("FedSoft trains full models: the initial model needs a head")
    shared = ModelParams(np.array(initial.encoder, dtype=np.float32), np.array(initial.head, dtype=np.float32))
    return [shared] * num_clients


def kept_copy(model: ModelParams) -> ModelParams:
    """A model the server can hold across rounds: its own writable float32 arrays,
    not a view into an upload (on Ray a view would pin the upload in the object store)."""
    head = None if model.head is None else np.array(model.head, dtype=np.float32, copy=True)
    return ModelParams(np.array(model.encoder, dtype=np.float32, copy=True), head)


def soft_centres(weights: np.ndarray, models: Sequence[ModelParams]) -> list[ModelParams | None]:
    """Per centre s, sum_k v_{s,k} w_k / sum_k v_{s,k} over all K models.

    `weights` is v, shape (S, K); `models` holds w_1..w_K in client order. Rows of
    v sum to one (`server_weights`), so this is c_s = sum_k v_{s,k} w_k up to the
    rounding of that sum. Clients with v_{s,k} = 0 are left out; a centre whose row
    has no positive weight (possible only with sigma = 0) gets None, and the caller
    keeps its previous value. Each centre is one `weighted_average_model` in client
    order (float64 accumulation), so the same inputs give the same bits."""
    v = np.asarray(weights, dtype=np.float64)
    if v.ndim != 2 or v.shape[1] != len(models):
        raise ValueError(f"weights must be (centres, clients) with one column per model, got {v.shape} for {len(models)} models")
    centres: list[ModelParams | None] = []
    for row in v:
        members = [int(k) for k in np.flatnonzero(row > 0)]
        if not members:
            centres.append(None)
            continue
        centres.append(weighted_average_model(members, lambda k: models[k], [float(row[k]) for k in members]))
    return centres
