"""FedBABU: train and average the body under one frozen random head; personalise once,
at the end, by fine-tuning the whole model on each client's training data (spec §2).

The head h_0 is the seeded initial head. The server keeps the only copy and
broadcasts it with the global encoder, so every client trains under the same head
and clients hold no private state at all. Local training leaves the head out of the
optimizer (`train_head=False`), so neither weight decay nor momentum can move it.
The encoder vector, BatchNorm running statistics included (§0 [REC]), is averaged
with sample weights over the round's participants.

Evaluation: every round each client scores (global encoder, h_0), logged as
"global" and used as the headline. At the final evaluation each client copies
(global encoder, h_0), fine-tunes all of it with a fresh SGD optimizer on its
training split only (BatchNorm in train mode, the protocol's batch size) and is
judged by the result, "personalized"; "global" is logged beside it as the
pre-fine-tuning number. Fine-tuning happens in the evaluate hook, so it never
changes client state: the fine-tuned model exists for scoring only.

Under privacy (docs/privacy.md) a client sends the clipped update of the encoder it
trained (h_0 is public: the seeded initial head, never trained) and the server steps
with their noised mean; the fine-tuned models never leave the clients.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
from pydantic import Field

from hdcfl_ray.maths.aggregate import LazyColumn, weighted_average
from hdcfl_ray.maths.server_optimizer import ServerMoments, server_step
from hdcfl_ray.algorithms.defaults import AlgorithmDefaults
from hdcfl_ray.algorithms.newcomer_training import fine_tuned
from hdcfl_ray.algorithms.private_updates import ClipState, clipped_update, next_round_clip, private_upload, released_encoder
from hdcfl_ray.contract import (
    ClientContext,
    ClientTask,
    EvalResult,
    MethodSpec,
    ModelParams,
    OptimizerConfig,
    PrivacyRule,
    RoundNotes,
    RunInfo,
    Section,
    Upload,
)


class FedBABUParams(Section):
    """Personalisation after the last round: full-model fine-tuning on local training data."""

    finetune_epochs: int = Field(5, ge=0, description="fine-tuning epochs after the last round")
    finetune_lr: float = Field(1.0e-2, gt=0.0, description="fine-tuning learning rate")
    finetune_momentum: float = Field(0.0, ge=0.0, lt=1.0, description="fine-tuning SGD momentum")
    finetune_weight_decay: float = Field(0.0, ge=0.0, description="fine-tuning weight decay")


@dataclass
class FedBABUState:
    global_encoder: np.ndarray
    head: np.ndarray  # h_0: fixed for the whole run, the same for every client
    server_moments: ServerMoments = field(default_factory=dict)  # protocol.server_optimizer's state
    clip: ClipState | None = None  # under privacy: the clip the clients use this round


def finetune_optimizer(params: FedBABUParams) -> OptimizerConfig:
    """The fresh optimizer of the final full-model fine-tuning (spec §2, step 5)."""
    return OptimizerConfig(
        name="sgd", lr=params.finetune_lr, momentum=params.finetune_momentum, weight_decay=params.finetune_weight_decay
    )


class FedBABU(AlgorithmDefaults):
    name = "fedbabu"

    def __init__(self, params: FedBABUParams, run: RunInfo) -> None:
        self.params = params
        self.finetune_optimizer = finetune_optimizer(params)
        self.server_optimizer = run.server_optimizer
        self.privacy = run.privacy
        self.seed = run.seed

    # ---- server ----
    def init_server(self, initial: ModelParams, independent: list[ModelParams], num_clients: int) -> FedBABUState:
        if initial.head is None:
            raise ValueError("FedBABU needs the seeded initial head h_0, but the initial model has none")
        return FedBABUState(
            global_encoder=np.array(initial.encoder, dtype=np.float32, copy=True),
            head=np.array(initial.head, dtype=np.float32, copy=True),
            clip=None if self.privacy is None else ClipState(self.privacy.clip),
        )

    def broadcast(self, state: FedBABUState, round_index: int) -> dict[str, Any]:
        return {"global": ModelParams(encoder=state.global_encoder, head=state.head)}

    def training_task(self, state: FedBABUState, round_index: int, client_id: int) -> ClientTask:
        return ClientTask(models=("global",), payload={} if self.privacy is None else {"clip": state.clip.clip})

    def aggregate(self, state: FedBABUState, round_index: int, uploads: list[Upload]) -> RoundNotes:
        events: tuple[str, ...] = ()
        if round_index == 1:
            events = ("fedbabu: head h_0 frozen and shared by all clients; encoder averaged with BatchNorm statistics",)
        if self.privacy is not None and state.clip is not None:
            # the noised mean of the clipped encoder updates, released even when no client took part
            averaged = released_encoder(self.privacy, state.clip.clip, uploads, state.global_encoder, self.seed, round_index)
            state.global_encoder = server_step(self.server_optimizer, state.server_moments, "global/encoder", state.global_encoder, averaged)
            state.clip.clip = next_round_clip(self.privacy, state.clip, uploads, self.seed, round_index)
            return RoundNotes(releases=(self.privacy.release(),), events=events)
        if not uploads:
            return RoundNotes(events=events)
        ordered = sorted(uploads, key=lambda upload: upload.client_id)
        averaged = weighted_average(LazyColumn(ordered, lambda u: u.models["encoder"]), [u.num_samples for u in ordered])
        state.global_encoder = server_step(self.server_optimizer, state.server_moments, "global/encoder", state.global_encoder, averaged)
        return RoundNotes(events=events)

    def evaluation_task(self, state: FedBABUState, round_index: int, client_id: int, final: bool) -> ClientTask:
        return ClientTask(models=("global",))

    # ---- client ----
    def init_client(self, client_id: int, initial: ModelParams) -> None:
        return None  # h_0 arrives with every broadcast; nothing is private until the final fine-tuning

    def local_update(self, ctx: ClientContext, state: None, task: ClientTask, objects: Mapping[str, Any]) -> tuple[Upload, None]:
        shared: ModelParams = objects["global"]
        ctx.load(shared)
        stats = ctx.train(train_head=False)
        if "clip" in task.payload:  # privacy: the clipped encoder update, never the encoder
            clip = float(task.payload["clip"])
            update, norm = clipped_update(shared, ctx.snapshot(), clip, with_head=False)
            return private_upload(ctx.client_id, stats.num_samples, stats.mean_loss, stats.steps, update, norm, clip), None
        upload = Upload(
            client_id=ctx.client_id,
            num_samples=stats.num_samples,
            train_loss=stats.mean_loss,
            steps=stats.steps,
            models={"encoder": ctx.snapshot().encoder},
        )
        return upload, None

    def evaluate(self, ctx: ClientContext, state: None, task: ClientTask, objects: Mapping[str, Any], final: bool) -> EvalResult:
        shared: ModelParams = objects["global"]
        references = {"global": ctx.score(shared)}
        if not final:
            return EvalResult(references=references, headline="global")
        if self.params.finetune_epochs == 0:  # no fine-tuning: the personalised model is the global one
            references["personalized"] = references["global"]
            return EvalResult(references=references, headline="personalized")
        ctx.load(shared)
        ctx.train(epochs=self.params.finetune_epochs, data=ctx.train_data(), optimizer=self.finetune_optimizer)
        references["personalized"] = ctx.score()
        return EvalResult(references=references, headline="personalized")

    # ---- newcomers (partition.newcomers): FedBABU's fine-tuning, for the newcomer budget ----
    def newcomer_task(self, state: FedBABUState, round_index: int, client_id: int, probe: Mapping[str, Any] | None) -> ClientTask:
        return ClientTask(models=("global",))

    def evaluate_newcomer(self, ctx: ClientContext, state: None, task: ClientTask, objects: Mapping[str, Any], epochs: int) -> EvalResult:
        shared: ModelParams = objects["global"]
        references = {"global": ctx.score(shared)}
        references["personalized"] = ctx.score(fine_tuned(ctx, shared, epochs, optimizer=self.finetune_optimizer))
        return EvalResult(references=references, headline="personalized")


METHOD = MethodSpec(
    name="fedbabu",
    summary="FedBABU: the body is federated with a frozen random head, then fine-tuned per client",
    params=FedBABUParams,
    build=lambda params, run: FedBABU(params, run),
    applies_server_optimizer=True,
    newcomer_rule="the global encoder and h_0, the whole model fine-tuned for protocol.newcomer_epochs epochs with FedBABU's "
    "fine-tuning optimiser (finetune_lr, finetune_momentum, finetune_weight_decay)",
    privacy=PrivacyRule(
        sends="the encoder's update under the frozen public head h_0, clipped: one noised mean a round",
        kept_on_client="the fine-tuned model of the final evaluation",
    ),
)
