"""Regularisers the runtime understands as data, not only as functions: a method that
passes one of these to `ClientContext.train` trains batched with the host's other
clients (runtime/client/batched_training.py), where an arbitrary function of the
model would train one client at a time.

Each is a `BatchableRegulariser`: per-parameter tensors (`targets`, in the order of
the model's parameters, encoder then head) and a `penalty` of the parameters and
those tensors. Batched training stacks every client's targets and vmaps the first
client's `penalty` over the stack, so everything that differs between clients must
live in `targets`; the other fields must be equal across the clients that train
together (or only shift the logged loss, never the gradient).

Imports no torch at module level (the contract's rule); the penalty imports it on use."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from hdcfl_ray.contract.context import ModelParts


@dataclass(frozen=True)
class BatchableRegulariser:
    """A loss term given by per-parameter tensors and a penalty of them (module docstring)."""

    targets: list[Any]

    def penalty(self, parameters: Sequence[Any], targets: Sequence[Any]) -> Any:
        raise NotImplementedError

    def __call__(self, model: ModelParts) -> Any:
        return self.penalty([*model.encoder.parameters(), *model.head.parameters()], self.targets)


@dataclass(frozen=True)
class ProximalPull(BatchableRegulariser):
    """(lambda/2) (U ||w - anchor||^2 + spread) over the model's parameters
    (`hdcfl_ray.algorithms.proximal.proximal_regulariser` builds one): a function of
    the model, and data that batched training reads to add the same term to each client's loss
    (runtime/client/batched_training.py), so the proximal methods train together too.

    `targets` are the anchor's pieces (tensors) in the order of the model's
    parameters (encoder, then head)."""

    strength: float
    total_importance: float
    spread: float

    def penalty(self, parameters: Sequence[Any], targets: Sequence[Any]) -> Any:
        """(lambda/2) (U ||w - anchor||^2 + spread) for the given parameter tensors."""
        import torch

        distance = torch.stack([(p - t).pow(2).sum() for p, t in zip(parameters, targets)]).sum()
        return 0.5 * self.strength * (self.total_importance * distance + self.spread)


@dataclass(frozen=True)
class LinearTerm(BatchableRegulariser):
    """<g, w> = sum over the model's parameters of g * w, elementwise: a loss term whose
    gradient is g itself, so every training step's gradient is corrected by g (a
    control-variate correction). `targets` are g's pieces (tensors) in the order of the
    model's parameters (encoder, then head)."""

    def penalty(self, parameters: Sequence[Any], targets: Sequence[Any]) -> Any:
        """<g, w> for the given parameter tensors."""
        import torch

        return torch.stack([(p * t).sum() for p, t in zip(parameters, targets)]).sum()
