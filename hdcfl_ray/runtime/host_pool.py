"""The client hosts as the server sees them, with crash recovery.

Every host has a generation id, new each time its actor (re)starts. The pool
keeps, for every client, an ObjectRef of its latest committed state (returned
with each update and owned by the server, so it outlives the host). When a host
dies, Ray restarts it (possibly on another node); the pool notices either the
actor error or a result from a new generation, gives the restarted host its
clients' states back and redoes the lost work. Every client's update is a pure
function of its state and the broadcast, so the run's results do not change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from hdcfl_ray.algorithms.base import ClientTask
from hdcfl_ray.runtime.messages import UploadMeta
from hdcfl_ray.runtime.transport import Transport

MAX_RECOVERIES = 5


class HostLost(RuntimeError):
    """A host failed more often than the pool will recover it."""


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
        self.state_refs: dict[int, Any] = {}
        self.recoveries = 0
        self.events: list[str] = []

    def clients_of(self, host_index: int) -> list[int]:
        return sorted(k for k, h in self.client_hosts.items() if h == host_index)

    # ---- recovery ----
    def recover(self, host_index: int) -> None:
        """Wait for a restarted host and give it back its clients' committed states."""
        self.recoveries += 1
        if self.recoveries > MAX_RECOVERIES:
            raise HostLost(f"client host {host_index} failed again after {MAX_RECOVERIES} recoveries; giving up")
        host = self.hosts[host_index]
        self.generations[host_index] = self.transport.get(self.transport.call(host, "generation"))
        states = {k: self.state_refs[k] for k in self.clients_of(host_index) if k in self.state_refs}
        self.transport.get(self.transport.call(host, "restore_states", states))
        self.events.append(
            f"client host {host_index} restarted; restored {len(states)} client state(s) and redid its unfinished work"
        )

    def _is_current(self, host_index: int, generation: str) -> bool:
        return self.generations[host_index] == generation

    # ---- training ----
    def submit(self, client_id: int, round_tag: int, task: ClientTask, needed: dict[str, Any]) -> TrainingHandle:
        host_index = self.client_hosts[client_id]
        args = (client_id, round_tag, task, needed)
        models_ref, meta_ref, state_ref = self.transport.train(self.hosts[host_index], *args)
        return TrainingHandle(client_id, host_index, args, models_ref, meta_ref, state_ref)

    def _resubmit(self, handle: TrainingHandle) -> TrainingHandle:
        return self.submit(*handle.args)

    def result(self, handle: TrainingHandle) -> tuple[UploadMeta, TrainingHandle]:
        """The meta of one update (recovering and redoing it if its host died)."""
        while True:
            meta = self._try_get(handle.meta_ref)
            if meta is not None and self._is_current(handle.host_index, meta.host_generation):
                self._commit(handle, meta)
                return meta, handle
            self.recover(handle.host_index)
            handle = self._resubmit(handle)

    def train_all(self, handles: list[TrainingHandle]) -> dict[int, tuple[UploadMeta, TrainingHandle]]:
        """Results of a whole synchronous round, taken as they finish."""
        done: dict[int, tuple[UploadMeta, TrainingHandle]] = {}
        pending = handles
        while pending:
            failed_hosts: set[int] = set()
            redo: list[TrainingHandle] = []
            for handle, meta in self._as_completed(pending):
                if meta is not None and self._is_current(handle.host_index, meta.host_generation):
                    self._commit(handle, meta)
                    done[handle.client_id] = (meta, handle)
                else:
                    failed_hosts.add(handle.host_index)
                    redo.append(handle)
            for host_index in sorted(failed_hosts):
                self.recover(host_index)
            pending = [self._resubmit(handle) for handle in sorted(redo, key=lambda h: h.client_id)]
        return done

    def _commit(self, handle: TrainingHandle, meta: UploadMeta) -> None:
        if meta.accepted:
            self.state_refs[handle.client_id] = handle.state_ref

    def _as_completed(self, handles: list[TrainingHandle]) -> list[tuple[TrainingHandle, UploadMeta | None]]:
        by_ref = {id(h.meta_ref): h for h in handles}
        results = []
        for meta_ref, value in self.transport.as_completed_refs([h.meta_ref for h in handles]):
            results.append((by_ref[id(meta_ref)], None if isinstance(value, BaseException) else value))
        return results

    def _try_get(self, ref: Any) -> Any:
        try:
            return self.transport.get(ref)
        except Exception as error:  # an actor that died holding this task
            if self.transport.is_actor_failure(error):
                return None
            raise

    # ---- batched calls (probe, evaluate) ----
    def call_per_host(self, method: str, args_of_host: dict[int, Callable[[], tuple[Any, ...]]]) -> dict[int, Any]:
        """Call `method` on several hosts at once; each returns (generation, value).
        A host that died (or restarted) is recovered and called again."""
        results: dict[int, Any] = {}
        pending = dict(args_of_host)
        while pending:
            futures = {h: self.transport.call(self.hosts[h], method, *make_args()) for h, make_args in sorted(pending.items())}
            retry: dict[int, Callable[[], tuple[Any, ...]]] = {}
            for host_index, future in futures.items():
                answer = self._try_get(future)
                if answer is not None and self._is_current(host_index, answer[0]):
                    results[host_index] = answer[1]
                else:
                    self.recover(host_index)
                    retry[host_index] = pending[host_index]
            pending = retry
        return results

    def restore_all(self, state_refs: dict[int, Any]) -> None:
        """Give every host its clients' states (resuming a run)."""
        self.state_refs.update(state_refs)
        for host_index, host in enumerate(self.hosts):
            states = {k: state_refs[k] for k in self.clients_of(host_index) if k in state_refs}
            self.transport.get(self.transport.call(host, "restore_states", states))

    def take_events(self) -> list[str]:
        events, self.events = self.events, []
        return events
