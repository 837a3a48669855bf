"""The training a newcomer does before it is scored (partition.newcomers,
docs/newcomers.md), shared by the methods' newcomer rules: a head trained on a frozen
shared encoder (the shared-encoder methods, HDC-FL's first step), and a whole model
fine-tuned from a shared one (the fine-tuning methods). Client side: every call
trains through `ctx.train`, so the runtime counts it in the newcomer's budget."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from hdcfl_ray.contract import ClientContext, ModelParams, OptimizerConfig

if TYPE_CHECKING:
    from hdcfl_ray.contract.context import Regulariser


def newcomer_head(ctx: ClientContext, global_encoder: np.ndarray, head: np.ndarray, epochs: int) -> np.ndarray:
    """`head` (the newcomer's initial head) trained `epochs` epochs on its training data
    over the frozen `global_encoder` (FedRep's head phase); `head` itself at 0 epochs. The
    encoder's BatchNorm statistics, which move in train mode, are never kept: a score loads
    the broadcast encoder again."""
    if epochs <= 0:
        return np.array(head, dtype=np.float32, copy=True)
    ctx.load(ModelParams(global_encoder), head=head)
    ctx.train(epochs=epochs, train_encoder=False)
    trained = ctx.snapshot().head
    assert trained is not None
    return trained


def fine_tuned(
    ctx: ClientContext,
    start: ModelParams,
    epochs: int,
    optimizer: OptimizerConfig | None = None,
    regulariser: Regulariser | None = None,
) -> ModelParams:
    """`start` (a full model) trained whole for `epochs` epochs on the newcomer's training
    data with the protocol's optimiser (or `optimizer`) and an optional loss term; `start`
    at 0 epochs."""
    if epochs <= 0:
        return start
    ctx.load(start)
    ctx.train(epochs=epochs, optimizer=optimizer, regulariser=regulariser)
    return ctx.snapshot()
