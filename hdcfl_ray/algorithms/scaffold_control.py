"""SCAFFOLD's control variates on the client: which entries of the flat model they
cover, the gradient correction as a loss term, and option II's update of c_k.

Control variates cover the model's parameters (encoder and head); a flat model also
holds BatchNorm running statistics, which no gradient moves: their entries of every
control variate stay zero (the vectors keep the model's shape, so c travels as one
model-sized vector, as the model does)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from hdcfl_ray.algorithms.proximal import parameter_columns
from hdcfl_ray.contract import ClientContext, LinearTerm, ModelParams

if TYPE_CHECKING:
    import torch


def zeros_like(model: ModelParams) -> ModelParams:
    """A control variate of zeros shaped like `model`."""
    head = None if model.head is None else np.zeros_like(model.head, dtype=np.float32)
    return ModelParams(encoder=np.zeros_like(model.encoder, dtype=np.float32), head=head)


def is_zero(model: ModelParams) -> bool:
    return not np.any(model.encoder) and (model.head is None or not np.any(model.head))


def difference(a: ModelParams, b: ModelParams) -> ModelParams:
    """a - b, float32."""
    head = None if a.head is None or b.head is None else (a.head - b.head).astype(np.float32)
    return ModelParams(encoder=(a.encoder - b.encoder).astype(np.float32), head=head)


def parameter_masks(ctx: ClientContext) -> tuple[np.ndarray, np.ndarray]:
    """True at the entries of the flat encoder and head vectors that are parameters
    (False at BatchNorm statistics)."""
    masks = []
    for module, index in ((ctx.model.encoder, ctx.encoder_index), (ctx.model.head, ctx.head_index)):
        mask = np.zeros(index.total_size, dtype=bool)
        for column in parameter_columns(index.entries, [name for name, _ in module.named_parameters()]):
            mask[column] = True
        masks.append(mask)
    return masks[0], masks[1]


def linear_correction(ctx: ClientContext, correction: ModelParams) -> LinearTerm:
    """<correction, w> over the model's parameters: each step's gradient gains `correction`
    (c - c_k). Batched training reads it as data (`LinearTerm`)."""
    import torch  # client side only: the server never imports torch

    pieces: list[torch.Tensor] = []
    for module, index, vector in ((ctx.model.encoder, ctx.encoder_index, correction.encoder), (ctx.model.head, ctx.head_index, correction.head)):
        named = list(module.named_parameters())
        assert vector is not None
        for (_, parameter), column in zip(named, parameter_columns(index.entries, [name for name, _ in named])):
            piece = torch.as_tensor(np.ascontiguousarray(vector[column]), device=parameter.device).reshape(parameter.shape)
            pieces.append(piece)
    return LinearTerm(targets=pieces)


def correction_at(correction: ModelParams, model: ModelParams) -> float:
    """<correction, model> in float64: the linear term's value at `model`."""
    total = float(np.dot(correction.encoder.astype(np.float64), model.encoder.astype(np.float64)))
    if correction.head is not None and model.head is not None:
        total += float(np.dot(correction.head.astype(np.float64), model.head.astype(np.float64)))
    return total


def updated_control(
    own: ModelParams, server: ModelParams, start: ModelParams, trained: ModelParams, masks: tuple[np.ndarray, np.ndarray], scale: float
) -> ModelParams:
    """Option II: c_k+ = c_k - c + (x - y_k) / scale on the parameters' entries (scale =
    a_k * lr, the local steps' length times the learning rate), zero elsewhere; float64
    arithmetic, float32 result. With no step taken (scale 0) c_k is kept."""
    if scale == 0.0:
        return own

    def part(ck: np.ndarray | None, c: np.ndarray | None, x: np.ndarray | None, y: np.ndarray | None, mask: np.ndarray) -> np.ndarray | None:
        if ck is None or c is None or x is None or y is None:
            return None
        moved = (np.asarray(x, np.float64) - np.asarray(y, np.float64)) / scale
        value = np.asarray(ck, np.float64) - np.asarray(c, np.float64) + moved
        return np.where(mask, value, 0.0).astype(np.float32)

    encoder = part(own.encoder, server.encoder, start.encoder, trained.encoder, masks[0])
    assert encoder is not None
    return ModelParams(encoder=encoder, head=part(own.head, server.head, start.head, trained.head, masks[1]))


def statistics_prescaled(start: ModelParams, trained: ModelParams, masks: tuple[np.ndarray, np.ndarray], server_lr: float) -> ModelParams:
    """The trained model as uploaded when the server steps by server_lr != 1: at the
    BatchNorm statistics' entries x + (y - x) / server_lr, so that the server's
    x + server_lr (mean(y) - x) averages the statistics as FedAvg does; the parameters as
    trained. With server_lr 1 the model is uploaded as it is."""
    if server_lr == 1.0:
        return trained

    def part(x: np.ndarray | None, y: np.ndarray | None, mask: np.ndarray) -> np.ndarray | None:
        if x is None or y is None:
            return y
        x64 = np.asarray(x, np.float64)
        statistics = x64 + (np.asarray(y, np.float64) - x64) / server_lr
        return np.where(mask, y, statistics).astype(np.float32)

    encoder = part(start.encoder, trained.encoder, masks[0])
    assert encoder is not None
    return ModelParams(encoder=encoder, head=part(start.head, trained.head, masks[1]))
