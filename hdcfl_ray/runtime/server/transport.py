"""How the server reaches client hosts: `RayTransport` through Ray actors and the
object store, `InProcessTransport` by direct calls on plain `ClientHost` objects
(the local backend and tests: the same round logic, no Ray)."""

from __future__ import annotations

from typing import Any, Protocol


class Transport(Protocol):
    def put(self, value: Any) -> Any: ...

    def get(self, handle: Any) -> Any: ...

    def train(self, host: Any, *args: Any) -> tuple[Any, Any, Any]: ...

    def train_many(self, host: Any, round_index: int, jobs: list[Any], object_refs: Any) -> list[Any]: ...

    def call(self, host: Any, method: str, *args: Any) -> Any: ...

    def as_completed_refs(self, handles: list[Any]) -> list[tuple[Any, Any]]: ...

    def is_actor_failure(self, error: BaseException) -> bool: ...

    def is_dead_actor(self, error: BaseException) -> bool: ...


class RayTransport:
    def put(self, value: Any) -> Any:
        import ray

        return ray.put(value)

    def get(self, handle: Any) -> Any:
        import ray

        return ray.get(handle)

    def train(self, host: Any, *args: Any) -> tuple[Any, Any, Any]:
        # Three returns (models, meta, client state): the arrays stay in the object
        # store under refs the server owns, and outlive the host that made them.
        return host.train.options(num_returns=3).remote(*args)

    def train_many(self, host: Any, round_index: int, jobs: list[Any], object_refs: Any) -> list[Any]:
        # (models, meta, state) per job, each under a ref of its own, as `train` returns them
        return host.train_many.options(num_returns=3 * len(jobs)).remote(round_index, jobs, object_refs)

    def call(self, host: Any, method: str, *args: Any) -> Any:
        return getattr(host, method).remote(*args)

    def as_completed_refs(self, handles: list[Any]) -> list[tuple[Any, Any]]:
        """(ref, value) in the order they finish (those found done together in the order
        given); a task whose actor died gives its error as the value (the caller
        recovers), any other error is raised."""
        import ray

        results, waiting = [], list(handles)
        while waiting:
            done, waiting = ray.wait(waiting, num_returns=1)
            if waiting:  # and every other one already done: one wait and one get for a batch, not one each
                more, waiting = ray.wait(waiting, num_returns=len(waiting), timeout=0)
                done += more
            try:
                values = ray.get(done)
            except Exception:  # one of them failed: take them one by one to tell which
                values = []
                for ref in done:
                    try:
                        values.append(ray.get(ref))
                    except Exception as error:
                        if not self.is_actor_failure(error):
                            raise
                        values.append(error)
            results.extend(zip(done, values))
        return results

    def is_actor_failure(self, error: BaseException) -> bool:
        from ray.exceptions import ActorUnavailableError, RayActorError

        return isinstance(error, (RayActorError, ActorUnavailableError))

    def is_dead_actor(self, error: BaseException) -> bool:
        """Gone for good (not merely restarting or unreachable for a moment)."""
        from ray.exceptions import ActorUnavailableError, RayActorError

        return isinstance(error, RayActorError) and not isinstance(error, ActorUnavailableError)


class InProcessTransport:
    def put(self, value: Any) -> Any:
        return value

    def get(self, handle: Any) -> Any:
        return handle

    def train(self, host: Any, *args: Any) -> tuple[Any, Any, Any]:
        return host.train(*args)

    def train_many(self, host: Any, round_index: int, jobs: list[Any], object_refs: Any) -> list[Any]:
        return host.train_many(round_index, jobs, object_refs)

    def call(self, host: Any, method: str, *args: Any) -> Any:
        return getattr(host, method)(*args)

    def as_completed_refs(self, handles: list[Any]) -> list[tuple[Any, Any]]:
        return [(handle, handle) for handle in handles]

    def is_actor_failure(self, error: BaseException) -> bool:
        return False

    def is_dead_actor(self, error: BaseException) -> bool:
        return False
