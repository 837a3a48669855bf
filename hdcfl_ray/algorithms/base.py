"""The one interface every federated algorithm implements, and the values it trades.

An algorithm is plain state plus a few hooks; the runtime (client host actors,
server actor) calls them and owns all Ray plumbing:

* `local_training` tells the client host how to train from the broadcast encoder;
* `aggregate` turns the round's client updates into the next global encoder;
* `is_refresh_round` / `refresh` let a method rebuild client-specific state from
  the server's cache (HDC-FL's groups, prototypes and mixtures);
* `uses_personalisation` says whether a client is scored with its personalised
  encoder (reference (c)) or with the global one (reference (a)).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence

import numpy as np


@dataclass(frozen=True)
class ClientUpdate:
    """What one client uploads after local training."""

    client_id: int
    encoder: np.ndarray  # flat float32 encoder after local training
    head: np.ndarray  # flat float32 private head ([W | b])
    num_samples: int
    train_loss: float


@dataclass(frozen=True)
class CachedClient:
    """The server's latest copy of a client's encoder and head."""

    encoder: np.ndarray
    head: np.ndarray
    num_samples: int
    round_index: int


@dataclass(frozen=True)
class Personalisation:
    """What a client needs to build its personalised encoder:
    phi_k = (1 - mix) * global + mix * sum_g memberships[k, g] * prototypes[g]."""

    prototypes: np.ndarray  # (G, D)
    memberships: Mapping[int, np.ndarray]  # client id -> (G,)
    group_labels: Mapping[int, int]  # client id -> hard group
    mix: float
    refresh_round: int


@dataclass(frozen=True)
class RefreshOutcome:
    personalisation: Personalisation
    silhouette: float
    effective_rank: int
    num_groups: int
    descriptor_kind: str
    extra: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class LocalTrainingPlan:
    train_head: bool = True


class Algorithm(Protocol):
    name: str
    uses_personalisation: bool

    def local_training(self) -> LocalTrainingPlan: ...

    def aggregate(self, global_encoder: np.ndarray, updates: Sequence[ClientUpdate]) -> np.ndarray: ...

    def is_refresh_round(self, round_index: int) -> bool: ...

    def refresh(self, round_index: int, global_encoder: np.ndarray, cache: Mapping[int, CachedClient]) -> RefreshOutcome | None: ...
