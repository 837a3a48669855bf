"""Ditto: a global model trained and averaged exactly as FedAvg's, plus a persistent
personal model v_k per client, trained each round the client is sampled on
CE + (lambda/2) ||v_k - w_global||^2, w_global being the model it downloaded that round.

- Order inside a local update: the global model trains first, then v_k. Both
  trainings draw their batch order from the client's one generator for the
  round, so training the global model first gives it FedAvg's batch order: the
  global model is FedAvg's bit for bit (tested). v_k depends on the downloaded
  model only, not on the client's global update, so the order changes nothing
  else (the reference code interleaves the two, one batch each).
- v_k starts from the shared initial model and is never sent; a client that has
  not been sampled yet is scored with it.
- Budget: a sampled client trains local_epochs for the global model plus
  personal_epochs for v_k (both counted), twice FedAvg's by default.
- lambda defaults to 0.1, re-derived for momentum SGD: one step pulls v_k toward
  w_global by lr * lambda / (1 - momentum) of the distance, so at lr 0.05,
  momentum 0.9 lambda = 0.1 pulls 5% per step, as the reference's lambda = 1 does
  under plain SGD at the same learning rate (docs/baselines.md, Ditto).
- Scored with v_k (`personalized`); the global model is logged beside it (`global`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from pydantic import Field

from hdcfl_ray.algorithms.fedavg import FedAvg
from hdcfl_ray.algorithms.proximal import proximal_regulariser
from hdcfl_ray.contract import ClientContext, ClientTask, EvalResult, MethodSpec, ModelParams, Section, Upload


class DittoParams(Section):
    """The personal model's training: its epochs and its proximal pull towards the global model."""

    # the paper picks lambda per device from {0.1, 1, 2} ({0.05, 0.1, 0.2} under strong attacks) with plain SGD,
    # where a step pulls by lr * lambda; under momentum SGD it pulls by lr * lambda / (1 - momentum): 0.1 here
    # pulls like 1 there
    proximal: float = Field(
        0.1,
        ge=0.0,
        description="lambda of (lambda/2)||v_k - w_global||^2, 0 = local training; 0.1 pulls 5% per step at lr 0.05, momentum 0.9",
    )
    personal_epochs: int | None = Field(
        None, ge=1, description="epochs of personal training per sampled round; null = protocol.local_epochs"
    )


@dataclass
class DittoClient:
    """A client's persistent personal model v_k."""

    model: ModelParams


class Ditto(FedAvg):
    name = "ditto"

    def __init__(self, params: DittoParams) -> None:
        self.params = params

    def init_client(self, client_id: int, initial: ModelParams) -> DittoClient:
        assert initial.head is not None
        return DittoClient(model=ModelParams(np.array(initial.encoder, np.float32), np.array(initial.head, np.float32)))

    def local_update(
        self, ctx: ClientContext, state: DittoClient, task: ClientTask, objects: Mapping[str, Any]
    ) -> tuple[Upload, DittoClient]:
        downloaded = objects["global"]
        ctx.load(downloaded)
        global_stats = ctx.train()  # first: the batch order FedAvg's update gets
        global_update = ctx.snapshot()

        regulariser = None
        if self.params.proximal > 0:
            regulariser = proximal_regulariser(ctx, [downloaded], np.ones(1), self.params.proximal)
        ctx.load(state.model)
        personal_stats = ctx.train(epochs=self.params.personal_epochs, regulariser=regulariser)
        personal = ctx.snapshot()
        # v_k never travels, so the runtime's check of uploads cannot see it: a diverged personal
        # training reports a NaN loss, and the runtime then refuses the whole update (v_k included)
        diverged = personal_stats.nonfinite or not personal.is_finite()
        upload = Upload(
            client_id=ctx.client_id,
            num_samples=global_stats.num_samples,
            train_loss=global_stats.mean_loss,  # the global model's, as FedAvg logs it
            steps=global_stats.steps,
            models={"model": global_update},
            values={"personal_loss": float("nan") if diverged else personal_stats.mean_loss},
        )
        return upload, DittoClient(model=personal)

    def evaluate(
        self, ctx: ClientContext, state: DittoClient, task: ClientTask, objects: Mapping[str, Any], final: bool
    ) -> EvalResult:
        return EvalResult(
            references={"personalized": ctx.score(state.model), "global": ctx.score(objects["global"])},
            headline="personalized",
        )


METHOD = MethodSpec(
    name="ditto",
    summary="Ditto: FedAvg's global model plus a personal model per client, pulled towards the global one",
    params=DittoParams,
    build=lambda params, _run: Ditto(params),
)
