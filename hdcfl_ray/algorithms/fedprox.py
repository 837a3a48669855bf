"""FedProx: FedAvg (one global model, encoder and head, sample-weighted averaging)
whose clients minimise CE + (mu/2) ||w - w_global||^2, w_global being the model
they downloaded this round.

- The anchor is the broadcast model itself (one anchor, weight 1), through the
  shared `proximal.proximal_regulariser`; BatchNorm statistics are not pulled but
  are averaged with everything else, as in FedAvg.
- mu = 0 switches the term off: FedProx is then FedAvg bit for bit (tested).
- mu defaults to 0.01, re-derived for momentum SGD: one step pulls w toward the
  anchor by lr * mu / (1 - momentum) of the distance, so at lr 0.05, momentum 0.9
  mu = 0.01 closes 0.5% per step, the pull of mu = 0.1 under the paper's plain SGD
  at the same learning rate (docs/baselines.md, FedProx).
- Scored with the global model, like FedAvg. Synchronous only.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
from pydantic import Field

from hdcfl_ray.algorithms.fedavg import FedAvg
from hdcfl_ray.algorithms.proximal import proximal_regulariser
from hdcfl_ray.contract import ClientContext, ClientTask, MethodSpec, Section, Upload


class FedProxParams(Section):
    """The proximal pull of every local update towards the downloaded global model."""

    # the paper tunes mu over {0.001, 0.01, 0.1, 1} under plain SGD, where a step pulls by lr * mu; under momentum
    # SGD it pulls by lr * mu / (1 - momentum), so 0.01 here pulls like the paper's 0.1 at the same learning rate
    mu: float = Field(
        0.01, ge=0.0, description="mu of (mu/2)||w - w_global||^2, 0 = FedAvg; 0.01 pulls 0.5% per step at lr 0.05, momentum 0.9"
    )


class FedProx(FedAvg):
    name = "fedprox"

    def __init__(self, params: FedProxParams) -> None:
        self.params = params

    def local_update(self, ctx: ClientContext, state: None, task: ClientTask, objects: Mapping[str, Any]) -> tuple[Upload, None]:
        broadcast = objects["global"]
        regulariser = None
        if self.params.mu > 0:
            regulariser = proximal_regulariser(ctx, [broadcast], np.ones(1), self.params.mu)
        ctx.load(broadcast)
        stats = ctx.train(regulariser=regulariser)
        # the training loss includes the proximal term, as minimised
        upload = Upload(ctx.client_id, stats.num_samples, stats.mean_loss, stats.steps, models={"model": ctx.snapshot()})
        return upload, None


METHOD = MethodSpec(
    name="fedprox",
    summary="FedProx: FedAvg with a proximal pull of each local update towards the downloaded global model",
    params=FedProxParams,
    build=lambda params, _run: FedProx(params),
)
