"""An upload's models as the server sees them: read from the transport on each
access, never held.

On Ray an update's arrays stay in the object store under the server's ref until
a method reads them; `ray.get` maps them without a copy and the mapping is
dropped again once the method's fold moves on, so the store may spill the rest
of the round to disk. Read through `maths.aggregate.LazyColumn`, a round of
a thousand ResNet-sized uploads is averaged with one upload in the server's
memory at a time. In one process (`InProcessTransport`) a read is the object itself.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from hdcfl_ray.runtime.server.transport import Transport


class StoredModels(Mapping[str, Any]):
    """A read-only {name: model} mapping backed by one object-store ref."""

    def __init__(self, transport: Transport, ref: Any) -> None:
        self._transport = transport
        self._ref = ref

    def _read(self) -> Mapping[str, Any]:
        return self._transport.get(self._ref)

    def __getitem__(self, name: str) -> Any:
        return self._read()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._read()))

    def __len__(self) -> int:
        return len(self._read())

    def __contains__(self, name: object) -> bool:
        return name in self._read()

    def __repr__(self) -> str:
        return f"StoredModels({sorted(self._read())})"
