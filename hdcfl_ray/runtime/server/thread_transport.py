"""In-process client hosts that train side by side, one Python thread each.

The local backend's hosts are plain `ClientHost` objects in the driver process.
With one host (`InProcessTransport`) every call is a direct call; with several,
`ThreadedTransport` gives each host a worker thread of its own and returns
futures, so the hosts train at the same time as Ray's host actors do, without
Ray's start-up and without an actor process per host. Each host runs its jobs
one after the other on its thread, with `runtime.torch_threads` torch threads
(set on that thread: OpenMP's thread count is per calling thread), and torch's
kernels release the GIL, so two one-thread hosts use two cores with no OpenMP
barrier between them. A client's update depends only on its inputs and its
(seed, client, round) generator, and the server applies updates in client-id
order, so results are the bits of one host, or of Ray hosts with the same
thread count.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from typing import Any

from hdcfl_ray.checkpoint.codec import register_in_process_ref


class FutureValue:
    """One of the three values (models, meta, state) of a training future: the
    in-process ObjectRef, handed back to hosts in later jobs and read there."""

    __slots__ = ("future", "index")

    def __init__(self, future: Future, index: int) -> None:
        self.future = future
        self.index = index

    def value(self) -> Any:
        return self.future.result()[self.index]


class ThreadedTransport:
    def __init__(self) -> None:
        self._workers: dict[int, ThreadPoolExecutor] = {}

    def _worker(self, host: Any) -> ThreadPoolExecutor:
        key = id(host)
        if key not in self._workers:
            self._workers[key] = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=f"client-host-{len(self._workers)}", initializer=host.bind_thread
            )
        return self._workers[key]

    def put(self, value: Any) -> Any:
        return value

    def get(self, handle: Any) -> Any:
        if isinstance(handle, FutureValue):
            return handle.value()
        if isinstance(handle, Future):
            return handle.result()
        return handle

    def train(self, host: Any, *args: Any) -> tuple[Any, Any, Any]:
        future = self._worker(host).submit(host.train, *args)
        return FutureValue(future, 0), FutureValue(future, 1), FutureValue(future, 2)

    def train_many(self, host: Any, round_index: int, jobs: list[Any], object_refs: Any) -> list[Any]:
        future = self._worker(host).submit(host.train_many, round_index, jobs, object_refs)
        return [FutureValue(future, index) for index in range(3 * len(jobs))]

    def call(self, host: Any, method: str, *args: Any) -> Any:
        return self._worker(host).submit(getattr(host, method), *args)

    def as_completed_refs(self, handles: list[Any]) -> list[tuple[Any, Any]]:
        """(handle, value) in the order the hosts finish them; an error is raised."""
        by_future: dict[Future, list[Any]] = {}
        for handle in handles:
            by_future.setdefault(handle.future if isinstance(handle, FutureValue) else handle, []).append(handle)
        results = []
        for future in as_completed(by_future):
            for handle in by_future[future]:
                results.append((handle, self.get(handle)))
        return results

    def is_actor_failure(self, error: BaseException) -> bool:
        return False

    def is_dead_actor(self, error: BaseException) -> bool:
        return False

    def close(self) -> None:
        for worker in self._workers.values():
            worker.shutdown(wait=True, cancel_futures=True)
        self._workers.clear()


register_in_process_ref(FutureValue)  # a checkpoint holds these as it holds ObjectRefs
