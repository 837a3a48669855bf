"""Regularisers the runtime understands as data, not only as functions: a method that
passes one of these to `ClientContext.train` trains batched with the host's other
clients (runtime/client/batched_training.py), where an arbitrary function of the
model would train one client at a time.

Imports no torch at module level (the contract's rule); the penalty imports it on use."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from hdcfl_ray.contract.context import ModelParts


@dataclass(frozen=True)
class ProximalPull:
    """(lambda/2) (U ||w - anchor||^2 + spread) over the model's parameters
    (`hdcfl_ray.algorithms.proximal.proximal_regulariser` builds one): a function of
    the model, and data that batched training reads to add the same term to each client's loss
    (runtime/client/batched_training.py), so the proximal methods train together too.

    `targets` are the anchor's pieces (tensors) in the order of the model's
    parameters (encoder, then head)."""

    targets: list[Any]
    strength: float
    total_importance: float
    spread: float

    def penalty(self, parameters: Sequence[Any], targets: Sequence[Any]) -> Any:
        """(lambda/2) (U ||w - anchor||^2 + spread) for the given parameter tensors."""
        import torch

        distance = torch.stack([(p - t).pow(2).sum() for p, t in zip(parameters, targets)]).sum()
        return 0.5 * self.strength * (self.total_importance * distance + self.spread)

    def __call__(self, model: ModelParts) -> Any:
        return self.penalty([*model.encoder.parameters(), *model.head.parameters()], self.targets)
