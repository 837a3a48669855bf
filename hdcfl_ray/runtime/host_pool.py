"""The client hosts as the server sees them, with crash recovery.

The server is the source of truth for every client's state: each update
returns the client's new state as an ObjectRef owned by the server, and every
job a host receives carries the state the server has committed for that
client. A host therefore holds nothing that cannot be rebuilt. When a host
actor dies, Ray restarts it (on another node if its node is gone); the pool
resubmits the work the dead actor had not finished, and because every update
is a pure function of (state, broadcast, seed), the run's results do not change.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from hdcfl_ray.algorithms.base import ClientTask
from hdcfl_ray.runtime.messages import INITIAL_STATE, UploadMeta
from hdcfl_ray.runtime.transport import Transport

MAX_RETRIES = 10
RESTART_WAIT_S = 300.0


class HostLost(RuntimeError):
    """A host failed more often, or stayed down longer, than the pool tolerates."""


@dataclass
class TrainingHandle:
    client_id: int
    host_index: int
    args: tuple[Any, ...]  # (client_id, round_tag, task, needed) to resubmit
    models_ref: Any
    meta_ref: Any
    state_ref: Any


class HostPool:
    def __init__(self, hosts: list, client_hosts: dict[int, int], transport: Transport) -> None:
        self.hosts = hosts
        self.client_hosts = client_hosts
        self.transport = transport
        self.generations = [transport.get(transport.call(host, "generation")) for host in hosts]
        self.state_refs: dict[int, Any] = {}  # committed client states
        self.retries = 0
        self.events: list[str] = []

    def state_of(self, client_id: int) -> Any:
        return self.state_refs.get(client_id, INITIAL_STATE)

    def commit(self, client_id: int, state_ref: Any) -> None:
        self.state_refs[client_id] = state_ref

    # ---- failures ----
    def _note_generation(self, host_index: int, generation: str) -> None:
        if generation != self.generations[host_index]:
            self.generations[host_index] = generation
            self.events.append(
                f"client host {host_index} was restarted; its clients' states come from the server, nothing was lost"
            )

    def _after_failure(self, host_index: int, error: BaseException) -> None:
        """Wait until Ray has the host back (bounded), so the resubmitted work can run."""
        self.retries += 1
        if self.retries > MAX_RETRIES:
            raise HostLost(f"client host {host_index} failed {MAX_RETRIES} times; giving up ({error})") from error
        self.events.append(f"client host {host_index} failed ({type(error).__name__}); its unfinished work is redone")
        deadline = time.monotonic() + RESTART_WAIT_S
        while True:
            try:
                generation = self.transport.get(self.transport.call(self.hosts[host_index], "generation"))
                self.generations[host_index] = generation
                return
            except Exception as wait_error:
                if not self.transport.is_actor_failure(wait_error) or time.monotonic() > deadline:
                    raise HostLost(f"client host {host_index} did not come back within {RESTART_WAIT_S:.0f} s: {wait_error}") from wait_error
                time.sleep(0.2)

    # ---- training ----
    def submit(self, client_id: int, round_tag: int, task: ClientTask, needed: dict[str, Any]) -> TrainingHandle:
        host_index = self.client_hosts[client_id]
        args = (client_id, round_tag, task, needed)
        models_ref, meta_ref, state_ref = self.transport.train(self.hosts[host_index], *args, self.state_of(client_id))
        return TrainingHandle(client_id, host_index, args, models_ref, meta_ref, state_ref)

    def result(self, handle: TrainingHandle) -> tuple[UploadMeta, TrainingHandle]:
        """The meta of one update, committing the client's new state (redone if its host died)."""
        while True:
            try:
                meta: UploadMeta = self.transport.get(handle.meta_ref)
            except Exception as error:
                if not self.transport.is_actor_failure(error):
                    raise
                self._after_failure(handle.host_index, error)
                handle = self.submit(*handle.args)
                continue
            self._note_generation(handle.host_index, meta.host_generation)
            if meta.accepted:
                self.commit(handle.client_id, handle.state_ref)
            return meta, handle

    def train_all(self, handles: list[TrainingHandle]) -> dict[int, tuple[UploadMeta, TrainingHandle]]:
        """Results of a whole synchronous round, taken as they finish."""
        done: dict[int, tuple[UploadMeta, TrainingHandle]] = {}
        pending = handles
        while pending:
            by_ref = {id(handle.meta_ref): handle for handle in pending}
            redo: list[TrainingHandle] = []
            for meta_ref, value in self.transport.as_completed_refs([handle.meta_ref for handle in pending]):
                handle = by_ref[id(meta_ref)]
                if isinstance(value, BaseException):
                    self._after_failure(handle.host_index, value)
                    redo.append(handle)
                    continue
                self._note_generation(handle.host_index, value.host_generation)
                if value.accepted:
                    self.commit(handle.client_id, handle.state_ref)
                done[handle.client_id] = (value, handle)
            pending = [self.submit(*handle.args) for handle in sorted(redo, key=lambda h: h.client_id)]
        return done

    # ---- batched calls (probe, evaluate): each returns (generation, value) ----
    def call_per_host(self, method: str, args_of_host: dict[int, Callable[[], tuple[Any, ...]]]) -> dict[int, Any]:
        results: dict[int, Any] = {}
        pending = dict(args_of_host)
        while pending:
            futures = {h: self.transport.call(self.hosts[h], method, *make_args()) for h, make_args in sorted(pending.items())}
            retry: dict[int, Callable[[], tuple[Any, ...]]] = {}
            for host_index, future in futures.items():
                try:
                    generation, value = self.transport.get(future)
                except Exception as error:
                    if not self.transport.is_actor_failure(error):
                        raise
                    self._after_failure(host_index, error)
                    retry[host_index] = pending[host_index]
                    continue
                self._note_generation(host_index, generation)
                results[host_index] = value
            pending = retry
        return results

    def take_events(self) -> list[str]:
        events, self.events = self.events, []
        return events
