"""Asynchronous federation on the virtual clock (FedAsync and FedBuff styles).

A fixed number of clients is in flight. Each starts from the current shared
vector; its virtual finish time follows from its profile and work. Updates are
applied in virtual-finish order (ties by client id), whatever order Ray
finishes them in, so an asynchronous run is reproducible while the training
itself runs in parallel. A "round" of the logs is one server version: one
applied update (FedAsync) or one flushed buffer of B updates (FedBuff), ended
in `round_tail` like a synchronous round. `AsyncFederatedServer` extends the
synchronous server (its broadcast, host pool, evaluation and checkpoints);
`AsyncServerActor` (runtime/backends/actors.py) is the Ray actor around it.
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from hdcfl_ray import seeding
from hdcfl_ray.algorithms.async_mixing import fedasync_mix, fedbuff_optimised_step
from hdcfl_ray.contract import RoundNotes, Upload
from hdcfl_ray.maths.server_optimizer import Moments
from hdcfl_ray.runtime.server.host_pool import TrainingHandle
from hdcfl_ray.runtime.server.messages import UploadMeta
from hdcfl_ray.runtime.server.round_tail import RoundReport, UpdateTiming, accepted_upload, close_round
from hdcfl_ray.runtime.server.sampling import available_clients
from hdcfl_ray.runtime.server.sync_server import FederatedServer


@dataclass
class InFlight:
    client_id: int
    virtual_start: float
    virtual_finish: float
    base_version: int
    base_vector: np.ndarray  # the shared vector the client started from (FedBuff deltas)
    handle: TrainingHandle
    bytes_down: int = 0  # what the client downloaded for this job, counted when its update arrives


class AsyncFederatedServer(FederatedServer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.version = 0
        self.dispatches = 0
        self.in_flight: dict[int, InFlight] = {}
        self.finish_queue: list[tuple[float, int]] = []
        self.buffer: list[tuple[Upload, InFlight]] = []
        self.server_moments = Moments()  # protocol.server_optimizer's state for the shared vector (FedBuff)

    # ---- checkpoints: the clients in flight are saved with their finished results ----
    def snapshot(self) -> dict[str, Any]:
        snapshot = super().snapshot()
        # actor handles are not state: a restored handle is resent to whichever actor then serves its host
        in_flight = {k: _without_actor(flight) for k, flight in self.in_flight.items()}
        snapshot.update(
            version=self.version,
            dispatches=self.dispatches,
            in_flight=in_flight,
            finish_queue=list(self.finish_queue),
            buffer=[(upload, _without_actor(flight)) for upload, flight in self.buffer],
            server_moments=self.server_moments,
        )
        return snapshot

    def restore(self, snapshot: dict[str, Any]) -> None:
        super().restore(snapshot)
        self.version = snapshot["version"]
        self.dispatches = snapshot["dispatches"]
        self.in_flight = dict(snapshot["in_flight"])
        self.finish_queue = [tuple(entry) for entry in snapshot["finish_queue"]]
        heapq.heapify(self.finish_queue)
        self.buffer = [tuple(entry) for entry in snapshot["buffer"]]
        self.server_moments = snapshot.get("server_moments", Moments())  # absent from a checkpoint before server optimisers

    # ---- dispatch ----
    def _idle_clients(self) -> list[int]:
        online = available_clients(self.num_clients, self.settings.protocol.availability, self.seed, self.dispatches + 1)
        # newcomers are never dispatched
        return [k for k in self.settings.training_clients(self.settings.available_at(online, self.virtual_time)) if k not in self.in_flight]

    def _dispatch(self, client_id: int) -> None:
        self.dispatches += 1
        settings = self.settings
        work = settings.protocol.local_epochs * settings.client_train_sizes[client_id]
        finish = self.virtual_time + settings.profiles[client_id].update_duration(work)
        object_refs = self._put_broadcast(self.version)
        task = self.algorithm.training_task(self.state, self.version, client_id)
        needed = {name: object_refs[name] for name in task.models}
        # the dispatch counter plays the round's part in the client's seed: every dispatch differs
        handle = self.pool.submit(client_id, self.dispatches, task, needed)
        self.in_flight[client_id] = InFlight(
            client_id, self.virtual_time, finish, self.version, np.array(self.algorithm.async_shared(self.state), copy=True), handle,
            bytes_down=self.traffic.task_bytes(task),
        )
        heapq.heappush(self.finish_queue, (finish, client_id))

    def _fill(self) -> None:
        concurrency = self.settings.protocol.asynchronous.concurrency
        while len(self.in_flight) < concurrency:
            idle = self._idle_clients()
            if not idle:
                return
            rng = seeding.rng(self.seed, "async_dispatch", self.dispatches)
            self._dispatch(int(idle[rng.integers(len(idle))]))

    # ---- one server version ----
    def run_round(self, round_index: int) -> RoundReport:
        started = time.perf_counter()
        config = self.settings.protocol.asynchronous
        events: list[str] = []
        timings: list[UpdateTiming] = []
        uploads_meta: list[UploadMeta] = []
        self._fill()
        applied = False
        while not applied:
            if not self.finish_queue:
                events.append("no client is available: the asynchronous run cannot advance")
                break
            finish, client_id = heapq.heappop(self.finish_queue)
            flight = self.in_flight.pop(client_id)
            self.virtual_time = finish
            meta, flight.handle = self.pool.result(flight.handle)
            uploads_meta.append(meta)
            self.traffic.sent_earlier(client_id, flight.bytes_down)
            self.traffic.received_update(client_id, meta, flight.handle.models_ref)
            staleness = self.version - flight.base_version
            upload = accepted_upload(meta, flight.handle, self.transport, events, not_taken="not applied")
            if upload is None:
                status = "rejected_nonfinite"
            else:
                self.algorithm.async_record(self.state, self.version, upload)
                if config.aggregation == "fedasync":
                    mixed = fedasync_mix(
                        self.algorithm.async_shared(self.state), self.algorithm.async_upload_vector(upload),
                        config.mixing, staleness, config.staleness_exponent,
                    )
                    self.algorithm.async_set_shared(self.state, mixed)
                    status, applied = "applied", True
                else:
                    # every buffered update is applied when the buffer flushes, within this version
                    self.buffer.append((upload, flight))
                    status = "buffered"
                    if len(self.buffer) >= config.buffer_size:
                        self._flush_buffer(config)
                        applied = True
            timings.append(UpdateTiming(client_id, status, flight.virtual_start, flight.virtual_finish, staleness))
            self._fill()
        notes_events: list[str] = []
        refresh = None
        aggregate_seconds = 0.0
        if applied:
            self.version += 1
            refresh_started = time.perf_counter()
            notes = self.algorithm.async_after_apply(self.state, self.version)
            aggregate_seconds = time.perf_counter() - refresh_started
            notes_events = list(notes.events)
            refresh = notes.refresh
        return close_round(
            self, round_index, started, selected=[t.client_id for t in timings], uploads=uploads_meta,
            notes=RoundNotes(refresh=refresh, events=tuple(notes_events)), events=events, timings=timings,
            aggregate_seconds=aggregate_seconds, late_events=notes_events,
        )

    def _flush_buffer(self, config: Any) -> None:
        """The buffered updates become one server step (protocol.server_optimizer's); staleness
        counts the versions applied since each client started."""
        shared, self.server_moments = fedbuff_optimised_step(
            self.algorithm.async_shared(self.state),
            [self.algorithm.async_upload_vector(upload) for upload, _ in self.buffer],
            [flight.base_vector for _, flight in self.buffer],
            [self.version - flight.base_version for _, flight in self.buffer],
            config.staleness_exponent,
            config.server_lr,
            self.settings.protocol.server_optimizer,
            self.server_moments,
        )
        self.algorithm.async_set_shared(self.state, shared)
        self.buffer = []


def _without_actor(flight: InFlight) -> InFlight:
    return dataclasses.replace(flight, handle=dataclasses.replace(flight.handle, actor=None))
