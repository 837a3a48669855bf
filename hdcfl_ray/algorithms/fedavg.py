"""FedAvg: one global model (encoder and head), sample-weighted averaging.

A reference row: every client is scored with the same global model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from hdcfl_ray.maths.aggregate import weighted_average_model
from hdcfl_ray.maths.server_optimizer import ServerMoments, server_step
from hdcfl_ray.algorithms.defaults import AlgorithmDefaults
from hdcfl_ray.algorithms.private_updates import ClipState, clipped_update, next_round_clip, private_upload, released_mean, shifted
from hdcfl_ray.contract import (
    ClientContext,
    ClientTask,
    EvalResult,
    MethodSpec,
    ModelParams,
    PrivacyRule,
    ResolvedPrivacy,
    RoundNotes,
    ServerOptimizerConfig,
    Upload,
)


@dataclass
class GlobalModelState:
    model: ModelParams
    server_moments: ServerMoments = field(default_factory=dict)  # protocol.server_optimizer's state
    clip: ClipState | None = None  # under privacy: the clip the clients use this round


class FedAvg(AlgorithmDefaults):
    name = "fedavg"

    def __init__(
        self, server_optimizer: ServerOptimizerConfig = ServerOptimizerConfig(), privacy: ResolvedPrivacy | None = None, seed: int = 0
    ) -> None:
        self.server_optimizer = server_optimizer
        self.privacy = privacy
        self.seed = seed

    def init_server(self, initial: ModelParams, independent: list[ModelParams], num_clients: int) -> GlobalModelState:
        return GlobalModelState(model=initial, clip=None if self.privacy is None else ClipState(self.privacy.clip))

    def init_client(self, client_id: int, initial: ModelParams) -> None:
        return None  # nothing is private

    def broadcast(self, state: GlobalModelState, round_index: int) -> dict[str, Any]:
        return {"global": state.model}

    def training_task(self, state: GlobalModelState, round_index: int, client_id: int) -> ClientTask:
        return ClientTask(models=("global",), payload={} if self.privacy is None else {"clip": state.clip.clip})

    def aggregate(self, state: GlobalModelState, round_index: int, uploads: list[Upload]) -> RoundNotes:
        if self.privacy is not None and state.clip is not None:
            return self._aggregate_private(self.privacy, state, state.clip, round_index, uploads)
        if uploads:
            ordered = sorted(uploads, key=lambda upload: upload.client_id)
            weights = [u.num_samples for u in ordered]
            averaged = weighted_average_model(ordered, lambda u: u.models["model"], weights)
            state.model = server_step(self.server_optimizer, state.server_moments, "global", state.model, averaged)
        return RoundNotes()

    def _aggregate_private(
        self, privacy: ResolvedPrivacy, state: GlobalModelState, clip: ClipState, round_index: int, uploads: list[Upload]
    ) -> RoundNotes:
        """The noised mean of the clipped updates (released even when no client took part)."""
        mean_update = released_mean(privacy, clip.clip, uploads, state.model, with_head=True, seed=self.seed, round_index=round_index)
        state.model = server_step(self.server_optimizer, state.server_moments, "global", state.model, shifted(state.model, mean_update))
        clip.clip = next_round_clip(privacy, clip, uploads, self.seed, round_index)
        return RoundNotes(releases=(privacy.release(),))

    # ---- asynchronous mode: encoder and head mixed as one vector ----
    def async_shared(self, state: GlobalModelState) -> np.ndarray:
        return np.concatenate([state.model.encoder, state.model.head])

    def async_set_shared(self, state: GlobalModelState, vector: np.ndarray) -> None:
        size = state.model.encoder.shape[0]
        state.model = ModelParams(encoder=np.asarray(vector[:size], np.float32), head=np.asarray(vector[size:], np.float32))

    def async_upload_vector(self, upload: Upload) -> np.ndarray:
        return np.concatenate([upload.models["model"].encoder, upload.models["model"].head])

    def async_record(self, state: GlobalModelState, version: int, upload: Upload) -> None:
        pass

    def async_after_apply(self, state: GlobalModelState, version: int) -> RoundNotes:
        return RoundNotes()

    def evaluation_task(self, state: GlobalModelState, round_index: int, client_id: int, final: bool) -> ClientTask:
        return ClientTask(models=("global",))

    def local_update(self, ctx: ClientContext, state: None, task: ClientTask, objects: Mapping[str, Any]) -> tuple[Upload, None]:
        ctx.load(objects["global"])
        stats = ctx.train()
        if "clip" in task.payload:  # privacy: the clipped update, never the model
            clip = float(task.payload["clip"])
            update, norm = clipped_update(objects["global"], ctx.snapshot(), clip, with_head=True)
            return private_upload(ctx.client_id, stats.num_samples, stats.mean_loss, stats.steps, update, norm, clip), None
        upload = Upload(ctx.client_id, stats.num_samples, stats.mean_loss, stats.steps, models={"model": ctx.snapshot()})
        return upload, None

    def evaluate(self, ctx: ClientContext, state: None, task: ClientTask, objects: Mapping[str, Any], final: bool) -> EvalResult:
        return EvalResult(references={"global": ctx.score(objects["global"])}, headline="global")

    # ---- newcomers (partition.newcomers): scored with the global model, as every client is ----
    def newcomer_task(self, state: GlobalModelState, round_index: int, client_id: int, probe: Mapping[str, Any] | None) -> ClientTask:
        return ClientTask(models=("global",))

    def evaluate_newcomer(self, ctx: ClientContext, state: Any, task: ClientTask, objects: Mapping[str, Any], epochs: int) -> EvalResult:
        return EvalResult(references={"global": ctx.score(objects["global"])}, headline="global")


# the newcomer rule of FedAvg and of the methods that score every client with its global model
GLOBAL_MODEL_RULE = "the global model as it stands, untrained (every client's model)"


METHOD = MethodSpec(
    name="fedavg",
    summary="FedAvg: one global model (encoder and head) for every client",
    build=lambda _params, run: FedAvg(run.server_optimizer, privacy=run.privacy, seed=run.seed),
    applies_server_optimizer=True,
    asynchronous=True,
    newcomer_rule=GLOBAL_MODEL_RULE,
    privacy=PrivacyRule(sends="the global model's update (encoder and head), clipped: one noised mean a round"),
)
