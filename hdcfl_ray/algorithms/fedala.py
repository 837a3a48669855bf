"""FedALA: FedAvg on the whole model, plus Adaptive Local Aggregation on each client
(spec §3; the blend itself lives in `ala`).

Server: the whole model (encoder, head, BatchNorm statistics) is averaged with
sample weights over the round's participants; the same model is broadcast to all.

Client state: the old local model theta_i (None until the client first trains),
the ALA weights W_i (one array per blended tensor; None means all ones) and the
start-phase flag. A participant builds its starting model by ALA from the global
model, trains the full model for E epochs, uploads it, and keeps the trained
model as its new theta_i together with the W_i and phase ALA produced.

Evaluation: every client, participant or not, is scored on the model ALA builds
from the current global model and its committed state (the PFLlib convention).
Evaluate hooks cannot change client state, so this ALA pass is a dry run: its
learned weights and phase are thrown away, and a client whose start phase has not
run yet repeats a start-phase pass at each evaluation until it next trains.
"personalized" is the headline; "global" (the global model with its global head)
and, once it exists, "local" (theta_i) are logged beside it.

Under privacy (docs/privacy.md) a participant sends the clipped update of the model it
trained against the global model it downloaded (unclipped and noiseless, the global model
plus their mean is the mean of the trained models, FedALA's average) and the server steps
with their noised mean; theta_i, W_i and ALA's epoch count and loss stay on the client.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
from pydantic import Field

from hdcfl_ray.maths.aggregate import weighted_average_model
from hdcfl_ray.maths.server_optimizer import ServerMoments, server_step
from hdcfl_ray.algorithms.defaults import AlgorithmDefaults
from hdcfl_ray.algorithms.newcomer_training import fine_tuned
from hdcfl_ray.algorithms.fedala_weights import EVALUATION_SUBSET_STREAM, TRAINING_SUBSET_STREAM, adaptive_local_init
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
    RunInfo,
    Section,
    Upload,
)


class FedALAParams(Section):
    """Adaptive Local Aggregation (docs/baselines.md, FedALA)."""

    layers: int = Field(2, ge=1, description="p: the top p parameter tensors are blended (tensors, not layers)")
    data_fraction: float = Field(0.8, gt=0.0, le=1.0, description="s: share of local data the blend weights learn on")
    eta: float = Field(1.0, gt=0.0, description="learning rate of the blend weights")
    start_max_epochs: int = Field(50, ge=1, description="start phase: at most this many weight-learning epochs")
    start_patience: int = Field(3, ge=1, description="start phase: epochs the loss must stay flat")
    start_tolerance: float = Field(1.0e-4, ge=0.0, description="start phase: loss change counted as flat")


@dataclass(frozen=True)
class ALAClientState:
    local: ModelParams | None = None  # theta_i: the client's last trained model
    weights: tuple[np.ndarray, ...] | None = None  # W_i, kept across rounds
    start_phase: bool = True


@dataclass
class FedALAServerState:
    model: ModelParams
    server_moments: ServerMoments = field(default_factory=dict)  # protocol.server_optimizer's state
    clip: ClipState | None = None  # under privacy: the clip the clients use this round


class FedALA(AlgorithmDefaults):
    name = "fedala"

    def __init__(self, params: FedALAParams, run: RunInfo) -> None:
        self.params = params
        self.server_optimizer = run.server_optimizer
        self.privacy = run.privacy
        self.seed = run.seed

    # ---- server ----
    def init_server(self, initial: ModelParams, independent: list[ModelParams], num_clients: int) -> FedALAServerState:
        if initial.head is None:
            raise ValueError("FedALA averages the whole model, but the initial model has no head")
        return FedALAServerState(model=initial, clip=None if self.privacy is None else ClipState(self.privacy.clip))

    def broadcast(self, state: FedALAServerState, round_index: int) -> dict[str, Any]:
        return {"global": state.model}

    def training_task(self, state: FedALAServerState, round_index: int, client_id: int) -> ClientTask:
        return ClientTask(models=("global",), payload={} if self.privacy is None else {"clip": state.clip.clip})

    def aggregate(self, state: FedALAServerState, round_index: int, uploads: list[Upload]) -> RoundNotes:
        events: list[str] = []
        if round_index == 1:
            events.append(
                f"fedala: whole model averaged with BatchNorm statistics; ALA blends the top {self.params.layers} "
                "parameter tensors, BatchNorm buffers restored after each ALA pass"
            )
        if self.privacy is not None and state.clip is not None:
            self._aggregate_private(self.privacy, state, state.clip, round_index, uploads)
            return RoundNotes(releases=(self.privacy.release(),), events=tuple(events))
        if not uploads:
            return RoundNotes(events=tuple(events))
        ordered = sorted(uploads, key=lambda upload: upload.client_id)
        weights = [u.num_samples for u in ordered]
        averaged = weighted_average_model(ordered, lambda u: u.models["model"], weights)
        state.model = server_step(self.server_optimizer, state.server_moments, "global", state.model, averaged)
        # The start phase can stall; the epoch counts show how often it hit its cap.
        epochs = ", ".join(f"{u.client_id}:{int(u.values.get('ala_epochs', 0))}" for u in ordered)
        events.append(f"fedala: ALA weight-learning epochs per participant (client:epochs) {epochs}")
        return RoundNotes(events=tuple(events))

    def _aggregate_private(
        self, privacy: ResolvedPrivacy, state: FedALAServerState, clip: ClipState, round_index: int, uploads: list[Upload]
    ) -> None:
        """The noised mean of the clipped updates (released even when no client took part)."""
        mean_update = released_mean(privacy, clip.clip, uploads, state.model, with_head=True, seed=self.seed, round_index=round_index)
        state.model = server_step(self.server_optimizer, state.server_moments, "global", state.model, shifted(state.model, mean_update))
        clip.clip = next_round_clip(privacy, clip, uploads, self.seed, round_index)

    def evaluation_task(self, state: FedALAServerState, round_index: int, client_id: int, final: bool) -> ClientTask:
        return ClientTask(models=("global",))

    # ---- client ----
    def init_client(self, client_id: int, initial: ModelParams) -> ALAClientState:
        return ALAClientState()

    def local_update(
        self, ctx: ClientContext, state: ALAClientState, task: ClientTask, objects: Mapping[str, Any]
    ) -> tuple[Upload, ALAClientState]:
        outcome = adaptive_local_init(
            ctx, objects["global"], state.local, state.weights, state.start_phase, self.params, TRAINING_SUBSET_STREAM
        )
        ctx.load(outcome.initial)
        stats = ctx.train()
        trained = ctx.snapshot()
        new_state = ALAClientState(local=trained, weights=outcome.weights, start_phase=outcome.start_phase)
        if "clip" in task.payload:  # privacy: the clipped update against the downloaded global model
            clip = float(task.payload["clip"])
            update, norm = clipped_update(objects["global"], trained, clip, with_head=True)
            return private_upload(ctx.client_id, stats.num_samples, stats.mean_loss, stats.steps, update, norm, clip), new_state
        values: dict[str, Any] = {"ala_epochs": outcome.epochs}
        if outcome.epoch_losses:
            values["ala_loss"] = outcome.epoch_losses[-1]
        upload = Upload(
            client_id=ctx.client_id,
            num_samples=stats.num_samples,
            train_loss=stats.mean_loss,
            steps=stats.steps,
            models={"model": trained},
            values=values,
        )
        return upload, new_state

    def evaluate(self, ctx: ClientContext, state: ALAClientState, task: ClientTask, objects: Mapping[str, Any], final: bool) -> EvalResult:
        global_model: ModelParams = objects["global"]
        references = {"global": ctx.score(global_model)}
        if state.local is not None:
            references["local"] = ctx.score(state.local)
        outcome = adaptive_local_init(
            ctx, global_model, state.local, state.weights, state.start_phase, self.params, EVALUATION_SUBSET_STREAM
        )
        references["personalized"] = ctx.score(outcome.initial)
        return EvalResult(references=references, headline="personalized")

    # ---- newcomers (partition.newcomers): ALA has no local model to blend, so the global model, fine-tuned ----
    def newcomer_task(self, state: FedALAServerState, round_index: int, client_id: int, probe: Mapping[str, Any] | None) -> ClientTask:
        return ClientTask(models=("global",))

    def evaluate_newcomer(self, ctx: ClientContext, state: ALAClientState, task: ClientTask, objects: Mapping[str, Any], epochs: int) -> EvalResult:
        global_model: ModelParams = objects["global"]
        references = {"global": ctx.score(global_model)}
        references["personalized"] = ctx.score(fine_tuned(ctx, global_model, epochs))
        return EvalResult(references=references, headline="personalized")


METHOD = MethodSpec(
    name="fedala",
    summary="FedALA: each client blends the global model into its local one with learned weights",
    params=FedALAParams,
    build=lambda params, run: FedALA(params, run),
    applies_server_optimizer=True,
    newcomer_rule="the global model (a newcomer has no local model for ALA to blend), fine-tuned whole for "
    "protocol.newcomer_epochs epochs",
    privacy=PrivacyRule(
        sends="the update of the trained model against the downloaded global model (encoder and head), clipped: one "
        "noised mean a round",
        kept_on_client="the local model theta_i, the ALA weights W_i and ALA's epoch count and loss",
    ),
)
