"""The local updates of a host's clients run side by side, so their training runs batched.

A method's `local_update` is ordinary sequential code (load weights, `ctx.train()`,
snapshot, maybe train again). To train a round's clients together without
changing that code, each client's update runs on a thread of its own, and the
threads take turns: exactly one runs at a time, in client order, until it either
finishes or calls `ctx.train` with settings that can run batched. There it parks.
When every client has parked or finished, the parked requests train together
(`batched_training.train_together`) and each client resumes with its own result,
to park again at its next `train` call or finish.

Because only one thread runs at a time and each client's code sees only its own
model replica, data and generator, every client computes what it would compute
alone; only the arithmetic of the batched kernels differs. Training that cannot
run batched (a method's own loop, Adam, float16) runs inside the client's turn,
one client at a time, exactly as without this module.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Generic, TypeVar

from hdcfl_ray.contract import TrainStats
from hdcfl_ray.runtime.client.batched_training import TrainRequest

ResultT = TypeVar("ResultT")


class RendezvousAborted(RuntimeError):
    """Raised inside a parked client when another client's update failed."""


@dataclass
class _Turn:
    """One client's thread and what it is waiting for."""

    go: threading.Event = field(default_factory=threading.Event)
    request: TrainRequest | None = None
    stats: TrainStats | None = None
    done: bool = False
    result: Any = None
    error: BaseException | None = None


class TrainingSlot:
    """What a client's context calls to hand its `train` request to the rendezvous."""

    def __init__(self, rendezvous: "TrainingRendezvous[Any]", turn: _Turn) -> None:
        self._rendezvous = rendezvous
        self._turn = turn

    def train(self, request: TrainRequest) -> TrainStats:
        return self._rendezvous._park(self._turn, request)


class TrainingRendezvous(Generic[ResultT]):
    """Runs `updates` (one per client, each given its `TrainingSlot`) to completion and
    returns their results in order. `trainer` trains a list of parked requests
    together; `thread_scope` is entered on every client thread (the host's torch
    thread count and autocast are per thread)."""

    def __init__(
        self,
        trainer: Callable[[list[TrainRequest]], list[TrainStats]],
        thread_scope: Callable[[], ContextManager[None]],
    ) -> None:
        self._trainer = trainer
        self._thread_scope = thread_scope
        self._yielded = threading.Event()
        self._aborted = False

    def run(self, updates: list[Callable[[TrainingSlot], ResultT]]) -> list[ResultT]:
        turns = [_Turn() for _ in updates]
        threads = [
            threading.Thread(target=self._client_body, args=(turn, update), name=f"client-update-{position}", daemon=True)
            for position, (turn, update) in enumerate(zip(turns, updates))
        ]
        for thread in threads:
            thread.start()
        try:
            runnable = list(range(len(turns)))
            while runnable:
                for position in runnable:
                    self._give_turn(turns[position])
                    if turns[position].error is not None:
                        raise turns[position].error
                parked = [position for position, turn in enumerate(turns) if not turn.done and turn.request is not None]
                if not parked:
                    break
                results = self._trainer([turns[position].request for position in parked])  # type: ignore[misc]
                for position, stats in zip(parked, results):
                    turns[position].request = None
                    turns[position].stats = stats
                runnable = parked
        finally:
            self._aborted = True  # a no-op when every update finished
            for turn, thread in zip(turns, threads):
                if not turn.done:
                    turn.go.set()
                thread.join()
        return [turn.result for turn in turns]

    def _give_turn(self, turn: _Turn) -> None:
        """Let one client run until it parks or finishes."""
        self._yielded.clear()
        turn.go.set()
        self._yielded.wait()

    def _client_body(self, turn: _Turn, update: Callable[[TrainingSlot], ResultT]) -> None:
        turn.go.wait()
        turn.go.clear()
        try:
            if not self._aborted:
                with self._thread_scope():
                    turn.result = update(TrainingSlot(self, turn))
        except RendezvousAborted:
            pass
        except BaseException as error:  # handed to the host's thread, which raises it
            turn.error = error
        finally:
            turn.done = True
            self._yielded.set()

    def _park(self, turn: _Turn, request: TrainRequest) -> TrainStats:
        turn.request = request
        self._yielded.set()
        turn.go.wait()
        turn.go.clear()
        if self._aborted:
            raise RendezvousAborted("another client's update failed")
        stats = turn.stats
        assert stats is not None
        turn.stats = None
        return stats
