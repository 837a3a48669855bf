"""Streaming aggregation: the server reads a round's uploads one at a time, in
client-id order, and the averages are the same bits as from uploads held in a list."""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import pytest

from hdcfl_ray.maths.aggregate import LazyColumn, weighted_average
from hdcfl_ray.algorithms.fedavg import FedAvg
from hdcfl_ray.algorithms.ifca import IFCA, IFCAParams
from hdcfl_ray.contract import ModelParams, RunInfo, Upload
from hdcfl_ray.runtime.server.stored_models import StoredModels

SIZE = 1000


class CountingStore:
    """A transport whose `get` returns a fresh copy and counts the copies alive."""

    def __init__(self) -> None:
        self.objects: dict[int, dict[str, Any]] = {}
        self.alive = 0
        self.peak_alive = 0

    def put(self, value: dict[str, Any]) -> int:
        self.objects[len(self.objects)] = value
        return len(self.objects) - 1

    def _released(self) -> None:
        self.alive -= 1

    def get(self, ref: int) -> dict[str, Any]:
        copy = {name: ModelParams(np.array(model.encoder), np.array(model.head)) for name, model in self.objects[ref].items()}
        for model in copy.values():
            self.alive += 1
            self.peak_alive = max(self.peak_alive, self.alive)
            weakref.finalize(model.encoder, self._released)
        return copy


def uploads(store: CountingStore, count: int, extra: dict[str, int] | None = None) -> list[Upload]:
    rng = np.random.default_rng(0)
    result = []
    for client_id in range(count):
        models = {"model": ModelParams(rng.standard_normal(SIZE).astype(np.float32), rng.standard_normal(10).astype(np.float32))}
        ref = store.put(models)
        values = {"cluster": (extra or {}).get("cluster", client_id % 2)}
        result.append(Upload(client_id, 10 + client_id, 0.0, 1, StoredModels(store, ref), values, models_ref=ref))
    return result


def test_lazy_column_gives_the_same_bits_as_a_list() -> None:
    rng = np.random.default_rng(1)
    vectors = [rng.standard_normal(SIZE).astype(np.float32) for _ in range(7)]
    weights = [3, 1, 4, 1, 5, 9, 2]
    lazy = weighted_average(LazyColumn(vectors, lambda v: v), weights)
    assert np.array_equal(lazy, weighted_average(vectors, weights))
    assert len(LazyColumn(vectors, lambda v: v)[2:5]) == 3


@pytest.mark.parametrize("count", [3, 40])
def test_fedavg_holds_one_upload_at_a_time_and_matches_held_uploads(count: int) -> None:
    store = CountingStore()
    streamed = uploads(store, count)
    algorithm = FedAvg()
    initial = ModelParams(np.zeros(SIZE, np.float32), np.zeros(10, np.float32))
    state = algorithm.init_server(initial, [], count)
    algorithm.aggregate(state, 1, streamed)
    assert store.peak_alive <= 2  # the fold's current upload (and the first one's shape probe)
    held = [Upload(u.client_id, u.num_samples, 0.0, 1, dict(store.objects[u.models_ref]), dict(u.values)) for u in streamed]
    reference = algorithm.init_server(initial, [], count)
    algorithm.aggregate(reference, 1, held)
    assert np.array_equal(state.model.encoder, reference.model.encoder)
    assert np.array_equal(state.model.head, reference.model.head)


def test_cluster_averages_stream_too() -> None:
    store = CountingStore()
    streamed = uploads(store, 12)
    algorithm = IFCA(IFCAParams(clusters=2), RunInfo(seed=0, rounds=3))
    initial = ModelParams(np.zeros(SIZE, np.float32), np.zeros(10, np.float32))
    independent = [ModelParams(np.ones(SIZE, np.float32), np.ones(10, np.float32)) for _ in range(2)]
    state = algorithm.init_server(initial, independent, 12)
    algorithm.aggregate(state, 1, streamed)
    assert store.peak_alive <= 2
    held = [Upload(u.client_id, u.num_samples, 0.0, 1, dict(store.objects[u.models_ref]), dict(u.values)) for u in streamed]
    reference = algorithm.init_server(initial, independent, 12)
    algorithm.aggregate(reference, 1, held)
    for streamed_model, held_model in zip(state.models, reference.models):
        assert np.array_equal(streamed_model.encoder, held_model.encoder)
