"""How to (re)build a client host actor: the Ray backend spawns each host from a
`HostSpec`, and the server's host pool keeps it to replace a host that dies.
Torch-free until a host is spawned: the spec travels to the server actor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class HostSpec:
    """How to build client host `i`: enough to replace one that died. The arrays
    travel as StoreRefs to driver-owned objects, so a replacement reads the same data."""

    options: dict[str, Any]
    name_prefix: str
    shared_args: tuple[Any, ...]  # scenario, algorithm, train/test arrays
    clients_of_host: tuple[Any, ...]  # per host: StoreRef to its ClientData list
    initial: Any
    num_classes: int

    def spawn(self, host_index: int, attempt: int = 0) -> Any:
        # Imported here: this spec travels to the server actor, which must not load torch
        # unless it has to replace a host.
        from hdcfl_ray.runtime.backends.actors import ClientHostActor

        name = f"{self.name_prefix}-{host_index}" + (f"-r{attempt}" if attempt else "")
        return ClientHostActor.options(**self.options, name=name).remote(
            *self.shared_args, self.clients_of_host[host_index], self.initial, self.num_classes
        )
