"""The runtime's own messages between the server actor and client hosts (torch-free,
so the server actor never imports torch); the values a method sees are in
hdcfl_ray.contract."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from hdcfl_ray.contract import ClientTask, EvalResult, TrainingBudget


@dataclass(frozen=True)
class UploadMeta:
    """The small half of a client's upload; the arrays travel as a separate object."""

    client_id: int
    num_samples: int
    train_loss: float
    steps: int
    values: Mapping[str, Any]
    accepted: bool  # False when the update held NaN/Inf: it is thrown away, the client's state kept
    compute_seconds: float = 0.0
    host_generation: str = ""  # which incarnation of the host actor produced it
    budget: TrainingBudget = TrainingBudget()  # local training work behind this update
    # the bytes of the update's models, counted where they were made (payload_bytes.py), so
    # the server counts an upload without fetching its arrays; None from an older host
    models_bytes: int | None = None
    # the size of the largest batched group its training ran in, itself included: the
    # clients whose `train` calls stepped as one model (runtime.batched_training); 1 when
    # every `train` call of the update trained alone
    trained_together: int = 1


@dataclass(frozen=True)
class StoreRef:
    """An ObjectRef passed inside a container so Ray does not resolve it at the call;
    the receiver fetches it (zero-copy for arrays on the same node)."""

    ref: Any


@dataclass(frozen=True)
class InitialState:
    """Marker: use the client's initial state (it has not trained yet)."""


INITIAL_STATE = InitialState()


@dataclass(frozen=True)
class ClientJob:
    client_id: int
    task: ClientTask
    # the client's committed state as the server knows it (an ObjectRef, or the value in-process)
    state: Any = INITIAL_STATE


@dataclass(frozen=True)
class EvalReport:
    client_id: int
    num_test_samples: int
    result: EvalResult
    extra: Mapping[str, Any] = field(default_factory=dict)
    # training done while evaluating (FedBABU's fine-tuning, FedALA's weight learning)
    budget: TrainingBudget = TrainingBudget()


@dataclass(frozen=True)
class NewcomerReport:
    """One newcomer's evaluation at one round (partition.newcomers): what the method's
    newcomer rule placed and scored it with, or `result` None for a method without a
    rule (`rule` then says so)."""

    client_id: int
    rule: str  # the method's newcomer rule as declared, or contract.NO_NEWCOMER_RULE
    num_train_samples: int
    num_test_samples: int = 0
    result: EvalResult | None = None
    # training the newcomer did to be placed and scored (fine-tuning, a head, its own model)
    budget: TrainingBudget = TrainingBudget()
