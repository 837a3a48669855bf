"""A proximal pull of a client's model towards anchor models, as a loss term for
`ClientContext.train`: (lambda/2) sum_s u_s ||w - c_s||^2 over the model's
parameters (FedSoft pulls towards all its centres weighted by the client's
importance; FedProx and Ditto towards one model with u = 1).

BatchNorm running statistics are buffers, not parameters, and are not pulled."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from hdcfl_ray.contract import ClientContext, ModelParams, ProximalPull

if TYPE_CHECKING:
    import torch

    from hdcfl_ray.contract.context import Regulariser


def proximal_anchor(centres: np.ndarray, importance: np.ndarray) -> tuple[np.ndarray, float]:
    """Rewrite sum_s u_s ||w - c_s||^2 as U ||w - anchor||^2 + spread.

    With U = sum_s u_s, anchor = sum_s u_s c_s / U and spread = sum_s u_s ||c_s - anchor||^2
    the two sides are equal for every w, so a training step needs one distance
    instead of S. `centres` is (S, D); the anchor is float32, the spread float64."""
    stacked = np.asarray(centres, dtype=np.float64)
    weights = np.asarray(importance, dtype=np.float64)
    anchor = (weights[:, None] * stacked).sum(axis=0) / weights.sum()
    spread = float((weights * ((stacked - anchor) ** 2).sum(axis=1)).sum())
    return anchor.astype(np.float32), spread


def parameter_columns(entries: Sequence[Any], parameter_names: Sequence[str]) -> list[slice]:
    """Where each named parameter sits in a flat vector described by FlatIndex
    `entries`; buffers (BatchNorm statistics) are skipped because they are not named."""
    by_name = {entry.name: entry for entry in entries}
    missing = [name for name in parameter_names if name not in by_name]
    if missing:
        raise ValueError(f"parameters {missing} are not in the flat index")
    return [slice(by_name[name].offset, by_name[name].offset + by_name[name].size) for name in parameter_names]


def proximal_regulariser(ctx: ClientContext, centres: Sequence[ModelParams], importance: np.ndarray, strength: float) -> Regulariser:
    """(lambda/2) sum_s u_s ||w - c_s||^2 over the model's parameters, as a function
    of the model for `ctx.train`. The centre side is reduced once per call to an
    anchor and a constant (`proximal_anchor`), so each step costs one distance."""
    import torch  # client side only: the server never imports torch

    parts = ((ctx.model.encoder, ctx.encoder_index, "encoder"), (ctx.model.head, ctx.head_index, "head"))
    targets: list[torch.Tensor] = []
    spread = 0.0
    for module, index, part in parts:
        named = list(module.named_parameters())
        columns = parameter_columns(index.entries, [name for name, _ in named])
        vectors = np.stack([getattr(centre, part) for centre in centres])
        anchor, part_spread = proximal_anchor(np.concatenate([vectors[:, c] for c in columns], axis=1), importance)
        spread += part_spread
        offset = 0
        for (_, parameter), column in zip(named, columns):
            size = column.stop - column.start
            piece = torch.as_tensor(anchor[offset : offset + size], device=parameter.device).reshape(parameter.shape)
            targets.append(piece)
            offset += size
    return ProximalPull(targets=targets, strength=float(strength), total_importance=float(np.sum(importance)), spread=spread)
