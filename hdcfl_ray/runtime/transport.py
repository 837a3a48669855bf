"""How the server reaches client hosts: through Ray actors, or by direct calls on
plain `ClientHost` objects (the same round logic, no Ray, for tests and debugging)."""

from __future__ import annotations

from typing import Any, Protocol


class Transport(Protocol):
    def put(self, value: Any) -> Any: ...

    def get(self, handle: Any) -> Any: ...

    def train(self, host: Any, *args: Any) -> tuple[Any, Any]: ...

    def call(self, host: Any, method: str, *args: Any) -> Any: ...

    def as_completed(self, handles: list[Any]) -> list[Any]: ...


class RayTransport:
    def put(self, value: Any) -> Any:
        import ray

        return ray.put(value)

    def get(self, handle: Any) -> Any:
        import ray

        return ray.get(handle)

    def train(self, host: Any, *args: Any) -> tuple[Any, Any]:
        # Two returns: the arrays stay in the object store under a ref the server owns.
        return host.train.options(num_returns=2).remote(*args)

    def call(self, host: Any, method: str, *args: Any) -> Any:
        return getattr(host, method).remote(*args)

    def as_completed(self, handles: list[Any]) -> list[Any]:
        """Values in the order they finish (the server re-orders them)."""
        import ray

        values, waiting = [], list(handles)
        while waiting:
            done, waiting = ray.wait(waiting, num_returns=1)
            values.append(ray.get(done[0]))
        return values


class InProcessTransport:
    def put(self, value: Any) -> Any:
        return value

    def get(self, handle: Any) -> Any:
        return handle

    def train(self, host: Any, *args: Any) -> tuple[Any, Any]:
        return host.train(*args)

    def call(self, host: Any, method: str, *args: Any) -> Any:
        return getattr(host, method)(*args)

    def as_completed(self, handles: list[Any]) -> list[Any]:
        return list(handles)
