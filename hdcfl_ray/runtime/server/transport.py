"""How the server reaches client hosts: `RayTransport` through Ray actors and the
object store, `InProcessTransport` by direct calls on plain `ClientHost` objects
(the local backend and tests: the same round logic, no Ray)."""

from __future__ import annotations

from typing import Any, Protocol


class Transport(Protocol):
    def put(self, value: Any) -> Any: ...

    def get(self, handle: Any) -> Any: ...

    def train(self, host: Any, *args: Any) -> tuple[Any, Any, Any]: ...

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

    def call(self, host: Any, method: str, *args: Any) -> Any:
        return getattr(host, method).remote(*args)

    def as_completed_refs(self, handles: list[Any]) -> list[tuple[Any, Any]]:
        """(ref, value) in the order they finish; a task whose actor died gives its
        error as the value (the caller recovers), any other error is raised."""
        import ray

        results, waiting = [], list(handles)
        while waiting:
            done, waiting = ray.wait(waiting, num_returns=1)
            try:
                results.append((done[0], ray.get(done[0])))
            except Exception as error:
                if not self.is_actor_failure(error):
                    raise
                results.append((done[0], error))
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

    def call(self, host: Any, method: str, *args: Any) -> Any:
        return getattr(host, method)(*args)

    def as_completed_refs(self, handles: list[Any]) -> list[tuple[Any, Any]]:
        return [(handle, handle) for handle in handles]

    def is_actor_failure(self, error: BaseException) -> bool:
        return False

    def is_dead_actor(self, error: BaseException) -> bool:
        return False
