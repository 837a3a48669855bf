"""The values a method trades with the runtime: models as flat vectors, tasks,
uploads, scores and what a round wants logged (numpy only)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np


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
class EvalStats:
    """A model's scores on one client's test set."""

    accuracy: float  # fraction in [0, 1]; NaN for an empty test set
    loss: float
    num_samples: int
    # accuracy when the prediction may only be one of the client's own training classes
    # (NaN where not computed): separates encoder quality from the label prior
    accuracy_own_classes: float = float("nan")


@dataclass(frozen=True)
class EvalResult:
    """Client -> server at evaluation rounds.

    `references` maps a reference name to its scores; the names `global`,
    `local` and `personalized` have their own log columns; `headline` names the
    one the method is judged by. `group`/`memberships` report the client's
    cluster where the method has clusters."""

    references: Mapping[str, EvalStats]
    headline: str
    group: int | None = None
    memberships: tuple[float, ...] | None = None


@dataclass(frozen=True)
class TrainStats:
    """What one call of `ClientContext.train` did."""

    mean_loss: float
    num_samples: int
    steps: int
    nonfinite: bool  # a NaN/Inf loss was seen: the update must not be trusted
    samples_processed: int = 0  # forward/backward passes over training samples (epochs x batches, as run)
    # the clients whose training ran as one batched model in this call, this one included
    # (runtime.batched_training); 1 when it trained alone
    trained_together: int = 1


@dataclass(frozen=True)
class TrainingBudget:
    """Training work a client did inside one hook: samples through forward/backward
    and optimiser steps, counted by the runtime whatever the method reports."""

    samples: int = 0
    steps: int = 0


@dataclass(frozen=True)
class RefreshSummary:
    """What a method that (re)groups its clients reports at a regrouping (a
    "refresh"): one row of the refresh table. Any method may return it in
    RoundNotes.refresh; the quality fields are optional."""

    round_index: int
    group_labels: dict[int, int]  # client id -> group
    memberships: dict[int, np.ndarray]  # client id -> soft membership over the groups (one-hot for hard groups)
    silhouette: float = float("nan")  # of the grouping in the method's descriptor space; NaN = not measured
    effective_rank: int | None = None  # of the descriptors the grouping read, when the method has one
    num_groups: int = 0  # 0 = one more than the largest group label
    descriptor_kind: str = ""  # what the grouping read (e.g. "heads")

    def __post_init__(self) -> None:
        if self.num_groups == 0:
            object.__setattr__(self, "num_groups", max(self.group_labels.values(), default=-1) + 1)


GroupingSummary = RefreshSummary


@dataclass(frozen=True)
class RoundNotes:
    """What the server hook wants logged about a round."""

    refresh: RefreshSummary | None = None
    events: tuple[str, ...] = ()  # human-readable notes (symmetry breaking, collapsed selections, ...)
    # under privacy (RunInfo.privacy): the (noise_multiplier, sample_rate, steps) releases this
    # hook made, each `steps` noised sums (ResolvedPrivacy.release builds one); the runtime
    # accounts them (the rounds table's epsilon). () = none, as without privacy
    releases: tuple[tuple[float, float, int], ...] = ()
