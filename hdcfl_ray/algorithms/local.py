"""Local-only training: every client trains its own full model and never shares it.

A reference row: what a client reaches on its own data alone. The server
aggregates nothing. Under privacy (docs/privacy.md) nothing changes: with no release the
epsilon stays 0, the row a DP study compares the private methods with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from hdcfl_ray.algorithms.defaults import AlgorithmDefaults
from hdcfl_ray.contract import ClientContext, ClientTask, EvalResult, MethodSpec, ModelParams, PrivacyRule, RoundNotes, Upload
from hdcfl_ray.contract.privacy import PlannedRelease


@dataclass
class OwnModel:
    model: ModelParams


class LocalOnly(AlgorithmDefaults):
    name = "local"

    def init_server(self, initial: ModelParams, independent: list[ModelParams], num_clients: int) -> None:
        return None

    def init_client(self, client_id: int, initial: ModelParams) -> OwnModel:
        return OwnModel(model=ModelParams(np.array(initial.encoder, copy=True), np.array(initial.head, copy=True)))

    def broadcast(self, state: None, round_index: int) -> dict[str, Any]:
        return {}

    def training_task(self, state: None, round_index: int, client_id: int) -> ClientTask:
        return ClientTask()

    def aggregate(self, state: None, round_index: int, uploads: list[Upload]) -> RoundNotes:
        return RoundNotes()

    def evaluation_task(self, state: None, round_index: int, client_id: int, final: bool) -> ClientTask:
        return ClientTask()

    def local_update(self, ctx: ClientContext, state: OwnModel, task: ClientTask, objects: Mapping[str, Any]) -> tuple[Upload, OwnModel]:
        ctx.load(state.model)
        stats = ctx.train()
        trained = ctx.snapshot()
        # Only counts travel: the model stays on the client.
        upload = Upload(ctx.client_id, stats.num_samples, stats.mean_loss, stats.steps, models={})
        return upload, OwnModel(model=trained)

    def evaluate(self, ctx: ClientContext, state: OwnModel, task: ClientTask, objects: Mapping[str, Any], final: bool) -> EvalResult:
        return EvalResult(references={"local": ctx.score(state.model)}, headline="local")

    # ---- newcomers (partition.newcomers): trained alone, as every client is, for the budget ----
    def newcomer_task(self, state: None, round_index: int, client_id: int, probe: Mapping[str, Any] | None) -> ClientTask:
        return ClientTask()  # nothing to send: a local model owes the federation nothing

    def evaluate_newcomer(self, ctx: ClientContext, state: OwnModel, task: ClientTask, objects: Mapping[str, Any], epochs: int) -> EvalResult:
        ctx.load(state.model)
        if epochs > 0:
            ctx.train(epochs=epochs)
        return EvalResult(references={"local": ctx.score()}, headline="local")


def no_release(params: object, rounds: int, total_rounds: int) -> tuple[PlannedRelease, ...]:
    """Local's plan under privacy: nothing leaves a client, so nothing is released."""
    return ()


METHOD = MethodSpec(
    name="local",
    summary="Local: every client trains alone; nothing is shared",
    build=lambda _params, _run: LocalOnly(),
    newcomer_rule="its own model trained alone from the initial model for protocol.newcomer_epochs epochs",
    privacy=PrivacyRule(
        sends="nothing: no model or update leaves a client, so nothing is released and epsilon stays 0 (a reference row)",
        kept_on_client="its whole model",
        planned_releases=no_release,
    ),
)
