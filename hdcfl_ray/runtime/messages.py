"""Values that travel between the server actor and client hosts (torch-free, so the
server actor never imports torch)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class EvalStats:
    accuracy: float  # fraction in [0, 1]; NaN for an empty test set
    loss: float
    num_samples: int


@dataclass(frozen=True)
class TrainReport:
    client_id: int
    head: np.ndarray
    num_samples: int
    train_loss: float
    steps: int
    accepted: bool  # False when the update held NaN/Inf and was thrown away


@dataclass(frozen=True)
class EvalJob:
    client_id: int
    own_encoder: object | None  # ObjectRef (or array) of the client's cached encoder; None if it never trained
    membership: np.ndarray | None  # personalised mixture weights, or None (use the global encoder)


@dataclass(frozen=True)
class EvalReport:
    client_id: int
    num_test_samples: int
    global_ref: EvalStats  # (a) global encoder + own head
    local_ref: EvalStats | None  # (b) own cached encoder + own head
    personalised_ref: EvalStats | None  # (c) prototype mixture + own head
