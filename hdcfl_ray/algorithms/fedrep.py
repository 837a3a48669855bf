"""FedRep: a shared encoder (the representation) averaged by the server and a private
head per client, trained head first, then body (Collins et al. 2021, "Exploiting Shared
Representations for Personalized Federated Learning"; docs/baselines.md, FedRep).

A sampled client loads the global encoder and its own head, then
1. trains the head alone for `head_epochs` with the encoder frozen: the head is fitted
   to the encoder it will be judged with before the encoder moves;
2. trains the encoder alone for `body_epochs` with that head frozen;
3. uploads the encoder.

Everything else is FedAvg-SE's (fedavg_se.py), which this class extends: the server's
sample-weighted encoder average (BatchNorm statistics included), its cache of each
client's latest encoder and head (never averaged, never sent to another client), the
scoring (the global encoder with the client's own head, "global", the headline; the
client's own cached encoder, "local") and the asynchronous mode. Only the local update
differs: FedAvg-SE trains encoder and head jointly (FedPer), FedRep alternates.

Each phase is one `ClientContext.train` call with a fresh optimizer; a frozen part is
left out of the optimizer, so neither momentum nor weight decay moves it. Training puts
the whole model in train mode, so a BatchNorm encoder would update its running
statistics during the head phase; they are restored afterwards, so the head phase leaves
the encoder exactly as broadcast.

Under privacy (docs/privacy.md) the client sends the clipped update of the encoder (its
body phase's result minus the broadcast encoder) and keeps its head; the server steps
with the noised mean, as FedAvg-SE's does, and keeps no cache."""

from __future__ import annotations

from typing import Any, Mapping

from pydantic import Field

from hdcfl_ray.algorithms.defaults import PrivateHead
from hdcfl_ray.algorithms.fedavg_se import SHARED_ENCODER_RULE, FedAvgSE
from hdcfl_ray.algorithms.private_updates import clipped_update, private_upload
from hdcfl_ray.contract import ClientContext, ClientTask, MethodSpec, ModelParams, PrivacyRule, RunInfo, Section, Upload


class FedRepParams(Section):
    """Local epochs of FedRep's two phases (docs/baselines.md, FedRep)."""

    # the paper's 10 head epochs per body epoch are cut to 5: the head is linear on small local
    # sets, and every head epoch costs a forward pass through the encoder (docs/baselines.md)
    head_epochs: int = Field(5, ge=1, description="epochs of head-only training (encoder frozen), first")
    body_epochs: int | None = Field(
        None, ge=1, description="epochs of encoder-only training (head frozen), second; null = protocol.local_epochs"
    )


class FedRep(FedAvgSE):
    name = "fedrep"

    def __init__(self, params: FedRepParams, run: RunInfo) -> None:
        super().__init__(server_optimizer=run.server_optimizer, privacy=run.privacy, seed=run.seed)
        self.params = params

    def local_update(self, ctx: ClientContext, state: PrivateHead, task: ClientTask, objects: Mapping[str, Any]) -> tuple[Upload, PrivateHead]:
        broadcast = ModelParams(objects["global"])
        ctx.load(broadcast, head=state.head)
        head_stats = ctx.train(epochs=self.params.head_epochs, train_encoder=False)
        # the frozen encoder's BatchNorm statistics moved in train mode: put the broadcast ones back
        ctx.load(broadcast, head=ctx.snapshot().head)
        body_epochs = self.params.body_epochs if self.params.body_epochs is not None else ctx.protocol.local_epochs
        body_stats = ctx.train(epochs=body_epochs, train_head=False)
        trained = ctx.snapshot()
        steps = head_stats.steps + body_stats.steps
        if "clip" in task.payload:  # privacy: the clipped encoder update; the head stays here
            clip = float(task.payload["clip"])
            update, norm = clipped_update(broadcast, trained, clip, with_head=False)
            upload = private_upload(ctx.client_id, body_stats.num_samples, body_stats.mean_loss, steps, update, norm, clip)
            return upload, PrivateHead(head=trained.head)
        upload = Upload(
            client_id=ctx.client_id,
            num_samples=body_stats.num_samples,
            train_loss=body_stats.mean_loss,  # the encoder's phase: the loss of what is uploaded
            steps=steps,
            models={"encoder": trained.encoder},
            values={"head": trained.head},
        )
        return upload, PrivateHead(head=trained.head)


METHOD = MethodSpec(
    name="fedrep",
    summary="FedRep: a shared encoder is averaged; each client trains its private head first, then the encoder",
    params=FedRepParams,
    build=lambda params, run: FedRep(params, run),
    applies_server_optimizer=True,
    asynchronous=True,
    # FedRep's own protocol for a new client: its head on the frozen representation (FedAvg-SE's hooks)
    newcomer_rule=SHARED_ENCODER_RULE,
    privacy=PrivacyRule(
        sends="the shared encoder's update after the body phase, clipped: one noised mean a round",
        kept_on_client="the head, and the encoder it trained (the server keeps no cache, so no 'local' reference)",
    ),
)
