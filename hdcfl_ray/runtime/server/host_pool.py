"""The client hosts as the server sees them, with crash recovery.

The server is the source of truth for every client's state: each update
returns the client's new state as an ObjectRef owned by the server, and every
job a host receives carries the state the server has committed for that
client. A host therefore holds nothing that cannot be rebuilt. When a host
actor dies, the pool starts a replacement from the same constructor arguments
(Ray places it wherever resources allow, so a lost node's clients move to
other nodes) and resubmits the work the dead actor had not finished; because
every update is a pure function of (state, broadcast, seed), the run's results
do not change.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from hdcfl_ray.contract import ClientTask
from hdcfl_ray.runtime.server.messages import INITIAL_STATE, ClientJob, UploadMeta
from hdcfl_ray.runtime.server.transport import Transport

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
    actor: Any = None  # the host actor the work was sent to
    # the clients whose jobs went to the host in one call (batched training): redone together,
    # so a redone client trains beside the same clients and gets the same bits
    batch: tuple[int, ...] | None = None


class HostPool:
    def __init__(
        self, hosts: list, client_hosts: dict[int, int], transport: Transport, spawner: Any = None, max_replacements: int = 0
    ) -> None:
        self.hosts = list(hosts)
        self.spawner = spawner  # builds host i anew (runtime.backends.host_spec.HostSpec); None in-process
        self.max_replacements = max_replacements
        self.replacements = 0
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

    def _after_failure(self, host_index: int, error: BaseException, actor: Any) -> None:
        """Replace a dead host (once, however many of its tasks failed) or wait for an
        unavailable one to come back (bounded), so the resubmitted work can run."""
        if actor is not self.hosts[host_index]:
            return  # that actor was already replaced after an earlier failure
        self.retries += 1
        if self.retries > MAX_RETRIES:
            raise HostLost(f"client host {host_index} failed {MAX_RETRIES} times; giving up ({error})") from error
        if self.transport.is_dead_actor(error):
            if self.spawner is None or self.replacements >= self.max_replacements:
                raise HostLost(
                    f"client host {host_index} died and {self.replacements} of runtime.max_restarts = "
                    f"{self.max_replacements} replacements are used up ({error})"
                ) from error
            self.replacements += 1
            self.hosts[host_index] = self.spawner.spawn(host_index, attempt=self.replacements)
            self.events.append(
                f"client host {host_index} died; replaced by a new actor ({self.replacements} of {self.max_replacements}); "
                f"its clients' states come from the server and its unfinished work is redone"
            )
        else:
            self.events.append(f"client host {host_index} was unavailable ({type(error).__name__}); its unfinished work is redone")
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
        actor = self.hosts[host_index]
        models_ref, meta_ref, state_ref = self.transport.train(actor, *args, self.state_of(client_id))
        return TrainingHandle(client_id, host_index, args, models_ref, meta_ref, state_ref, actor)

    def submit_many(self, entries: list[tuple[int, int, ClientTask, dict[str, Any]]]) -> list[TrainingHandle]:
        """The jobs of clients on one host in one call: `entries` are `submit`'s arguments
        (client_id, round_tag, task, needed), every client on the same host."""
        host_index = self.client_hosts[entries[0][0]]
        if any(self.client_hosts[entry[0]] != host_index for entry in entries):
            raise ValueError("submit_many: every client must be on one host")
        round_tag = entries[0][1]
        jobs = [ClientJob(client_id, task, self.state_of(client_id)) for client_id, _, task, _ in entries]
        needed = {name: ref for entry in entries for name, ref in entry[3].items()}
        actor = self.hosts[host_index]
        refs = self.transport.train_many(actor, round_tag, jobs, needed)
        batch = tuple(entry[0] for entry in entries)
        return [
            TrainingHandle(entry[0], host_index, entry, *refs[3 * position : 3 * position + 3], actor=actor, batch=batch)
            for position, entry in enumerate(entries)
        ]

    def _resubmit(self, handles: list[TrainingHandle]) -> list[TrainingHandle]:
        """Send failed work again: a batch's clients together, others one by one."""
        batches: dict[tuple[int, ...], list[TrainingHandle]] = {}
        resent: list[TrainingHandle] = []
        for handle in sorted(handles, key=lambda h: h.client_id):
            if handle.batch is None:
                resent.append(self.submit(*handle.args))
            else:
                batches.setdefault(handle.batch, []).append(handle)
        for members in batches.values():
            resent.extend(self.submit_many([handle.args for handle in members]))
        return resent

    def result(self, handle: TrainingHandle) -> tuple[UploadMeta, TrainingHandle]:
        """The meta of one update, committing the client's new state (redone if its host died)."""
        while True:
            try:
                meta: UploadMeta = self.transport.get(handle.meta_ref)
            except Exception as error:
                if not self.transport.is_actor_failure(error):
                    raise
                self._after_failure(handle.host_index, error, handle.actor)
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
                    self._after_failure(handle.host_index, value, handle.actor)
                    redo.append(handle)
                    continue
                self._note_generation(handle.host_index, value.host_generation)
                if value.accepted:
                    self.commit(handle.client_id, handle.state_ref)
                done[handle.client_id] = (value, handle)
            pending = self._resubmit(redo)
        return done

    # ---- batched calls (probe, evaluate): each returns (generation, value) ----
    def call_per_host(self, method: str, args_of_host: dict[int, Callable[[], tuple[Any, ...]]]) -> dict[int, Any]:
        results: dict[int, Any] = {}
        pending = dict(args_of_host)
        while pending:
            actors = {h: self.hosts[h] for h in pending}
            futures = {h: self.transport.call(actors[h], method, *make_args()) for h, make_args in sorted(pending.items())}
            retry: dict[int, Callable[[], tuple[Any, ...]]] = {}
            for host_index, future in futures.items():
                try:
                    generation, value = self.transport.get(future)
                except Exception as error:
                    if not self.transport.is_actor_failure(error):
                        raise
                    self._after_failure(host_index, error, actors[host_index])
                    retry[host_index] = pending[host_index]
                    continue
                self._note_generation(host_index, generation)
                results[host_index] = value
            pending = retry
        return results

    def take_events(self) -> list[str]:
        events, self.events = self.events, []
        return events
