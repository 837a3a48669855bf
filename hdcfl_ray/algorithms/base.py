"""The one interface every federated algorithm implements, and the values it trades.

An algorithm is one object with server hooks (numpy, run in the server actor)
and client hooks (torch, run in client host actors). The runtime owns all Ray
plumbing and calls the hooks in this order each round:

    server: select -> probe_task? -> broadcast -> training_task per client
    client: probe (all clients with a probe task) ; local_update (selected)
    server: absorb_probes ; aggregate (returns RoundNotes)
    at evaluation rounds: evaluation_task per client -> client: evaluate

Server state and per-client state are plain objects owned by the algorithm;
the runtime stores them and passes them back, never looks inside.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Protocol

import numpy as np

if TYPE_CHECKING:  # torch-side types; the server never imports them
    from hdcfl_ray.runtime.client_context import ClientContext
    from hdcfl_ray.runtime.messages import EvalStats


@dataclass(frozen=True)
class ModelParams:
    """A model as flat float32 vectors: encoder and (optionally) head ([W | b])."""

    encoder: np.ndarray
    head: np.ndarray | None = None

    def is_finite(self) -> bool:
        return bool(np.isfinite(self.encoder).all()) and (self.head is None or bool(np.isfinite(self.head).all()))


@dataclass(frozen=True)
class ClientTask:
    """Server -> client: which broadcast objects the client needs (by name) and
    small per-client values (a membership row, a cluster index, an ObjectRef)."""

    models: tuple[str, ...] = ()
    payload: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Upload:
    """Client -> server after local training.

    `models` holds the large arrays (they travel through the object store; the
    server may keep `models_ref` instead of a copy), `values` the small ones."""

    client_id: int
    num_samples: int
    train_loss: float
    steps: int
    models: Mapping[str, Any]
    values: Mapping[str, Any] = field(default_factory=dict)
    models_ref: Any = None


@dataclass(frozen=True)
class EvalResult:
    """Client -> server at evaluation rounds.

    `references` maps a reference name to its scores; the names `global`,
    `local` and `personalized` have their own log columns; `headline` names the
    one the method is judged by. `group`/`memberships` report the client's
    cluster where the method has clusters."""

    references: Mapping[str, "EvalStats"]
    headline: str
    group: int | None = None
    memberships: tuple[float, ...] | None = None


@dataclass(frozen=True)
class RefreshSummary:
    """What an HDC-FL refresh produced, for the refresh table."""

    round_index: int
    group_labels: dict[int, int]
    memberships: dict[int, np.ndarray]
    silhouette: float
    effective_rank: int
    num_groups: int
    descriptor_kind: str


@dataclass(frozen=True)
class RoundNotes:
    """What the server hook wants logged about a round."""

    refresh: RefreshSummary | None = None
    events: tuple[str, ...] = ()  # human-readable notes (symmetry breaking, collapsed selections, ...)


class Algorithm(Protocol):
    name: str

    # ---- server side (numpy only) ----
    # independent seeded initialisations a method asks for (cluster models, FedSoft centres)
    independent_inits: int

    def init_server(self, initial: ModelParams, independent: list[ModelParams], num_clients: int) -> Any: ...

    # `sampled`: the runtime's seeded draw among `online` (the clients available this round)
    def select(self, state: Any, round_index: int, sampled: list[int], online: list[int]) -> list[int]: ...

    def probe_task(self, state: Any, round_index: int, client_id: int) -> ClientTask | None: ...

    def absorb_probes(self, state: Any, round_index: int, results: Mapping[int, Mapping[str, Any]]) -> RoundNotes: ...

    def broadcast(self, state: Any, round_index: int) -> dict[str, Any]: ...

    def training_task(self, state: Any, round_index: int, client_id: int) -> ClientTask: ...

    def aggregate(self, state: Any, round_index: int, uploads: list[Upload]) -> RoundNotes: ...

    def evaluation_task(self, state: Any, round_index: int, client_id: int, final: bool) -> ClientTask: ...

    # ---- client side (torch, inside a client host) ----
    def init_client(self, client_id: int, initial: ModelParams) -> Any: ...

    def probe(self, ctx: "ClientContext", state: Any, task: ClientTask, objects: Mapping[str, Any]) -> Mapping[str, Any]: ...

    def local_update(self, ctx: "ClientContext", state: Any, task: ClientTask, objects: Mapping[str, Any]) -> tuple[Upload, Any]: ...

    def evaluate(self, ctx: "ClientContext", state: Any, task: ClientTask, objects: Mapping[str, Any], final: bool) -> EvalResult: ...


class AsyncCapable(Protocol):
    """Methods that can run in `protocol.mode: async`: the runtime mixes one update
    (FedAsync) or a buffer of updates (FedBuff) into one shared vector."""

    def async_shared(self, state: Any) -> np.ndarray: ...

    def async_set_shared(self, state: Any, vector: np.ndarray) -> None: ...

    def async_upload_vector(self, upload: Upload) -> np.ndarray: ...

    def async_record(self, state: Any, version: int, upload: Upload) -> None: ...

    def async_after_apply(self, state: Any, version: int) -> RoundNotes: ...


def supports_async(algorithm: Any) -> bool:
    return all(hasattr(algorithm, hook) for hook in ("async_shared", "async_set_shared", "async_upload_vector", "async_record", "async_after_apply"))
