"""Scores of predicted classes (torch only: the methods that ensemble or restrict
predictions use them, below the rest of the training library)."""

from __future__ import annotations

import torch

from hdcfl_ray.contract import EvalStats


def restricted_predictions(scores: torch.Tensor, own_classes: torch.Tensor) -> torch.Tensor:
    """argmax over the client's own training classes only (logits or probabilities):
    what a shared head's prediction is worth once the label prior of the client is known."""
    masked = torch.full_like(scores, float("-inf"))
    masked[:, own_classes] = scores[:, own_classes]
    return masked.argmax(dim=1)


def stats_from_probabilities(probabilities: torch.Tensor, labels: torch.Tensor, own_classes: torch.Tensor | None = None) -> EvalStats:
    """Accuracy and NLL of predicted class probabilities (an ensemble's output); with
    `own_classes` also the accuracy restricted to those classes."""
    num_samples = int(labels.shape[0])
    if num_samples == 0:
        return EvalStats(accuracy=float("nan"), loss=float("nan"), num_samples=0)
    picked = probabilities[torch.arange(num_samples, device=labels.device), labels].clamp_min(1e-12)
    accuracy = float((probabilities.argmax(dim=1) == labels).float().mean())
    own = float("nan")
    if own_classes is not None:
        own = float((restricted_predictions(probabilities, own_classes) == labels).float().mean())
    return EvalStats(accuracy=accuracy, loss=float(-picked.log().mean()), num_samples=num_samples, accuracy_own_classes=own)
