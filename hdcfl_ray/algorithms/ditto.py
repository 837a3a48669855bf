"""Ditto: a global model trained and averaged exactly as FedAvg's, plus a persistent
personal model v_k per client, trained each round the client is sampled on
CE + (lambda/2) ||v_k - w_global||^2, w_global being the model it downloaded that round.

- Order inside a local update: the global model trains first, on the client's whole
  training data, then the personal model(s). All trainings draw their batch order
  from the client's one generator for the round, so training the global model first
  gives it FedAvg's batch order: the global model is FedAvg's bit for bit in both
  lambda modes (tested). v_k depends on the downloaded model only, not on the
  client's global update, so the order changes nothing else (the reference code
  interleaves the two, one batch each).
- lambda is chosen per client on local validation data, as in the paper
  (`lambda_selection: per_client`, the default): each client holds out a
  stratified share of its training data (`validation_split`), drawn once from the
  run seed and the client id, so it is the same every round. It keeps one personal
  model per candidate lambda, each trained on the rest of its training data and
  persistent across rounds; after training it picks the candidate with the best
  validation accuracy (ties: lower validation loss, then the smaller lambda,
  `choose_candidate`) and is scored with that one. The choices of the round's
  clients are logged as an event ("ditto: lambda chosen on local validation ...").
  `fixed` trains the one v_k on the whole training data with `proximal`.
- lambda is a data-dependent knob with no setting-free value: the paper picks it
  per device from a small set ({0.1, 1, 2}; {0.05, 0.1, 0.2} under strong attacks).
  The default grid spans weak to strong and holds those three; the fixed mode's
  default 0.1 is the smallest of them, and `hdcfl-ray calibrate` chooses `proximal`
  per setting on held-out validation data (docs/calibration.md). Neither is derived
  from this project's optimiser: the stationary point of the personal problem does
  not depend on the learning rate or the momentum.
- v_k starts from the shared initial model and is never sent; a client that has
  not been sampled yet is scored with it.
- Budget: a sampled client trains local_epochs for the global model plus
  personal_epochs for each personal model (all counted): twice FedAvg's in the
  fixed mode, 1 + (1 - validation_fraction) x candidates times it per client.
  Scoring the candidates on the validation share is forward only and not counted.
- Scored with v_k (`personalized`); the global model is logged beside it (`global`).
- Under privacy (docs/privacy.md) the client sends FedAvg's clipped update of the global
  model and nothing else: v_k, its candidates and the chosen lambda stay on the client
  (the server logs no lambda), and the personal training's loss is not sent. A diverged
  personal training still refuses the whole update: it makes the training loss NaN.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Mapping, Sequence

import numpy as np
from pydantic import Field, field_validator

from hdcfl_ray import seeding
from hdcfl_ray.algorithms.fedavg import FedAvg, GlobalModelState
from hdcfl_ray.algorithms.private_updates import clipped_update, private_upload
from hdcfl_ray.algorithms.proximal import proximal_regulariser
from hdcfl_ray.contract import (
    ClientContext,
    ClientTask,
    EvalResult,
    EvalStats,
    MethodSpec,
    ModelParams,
    PrivacyRule,
    ResolvedPrivacy,
    RoundNotes,
    Section,
    ServerOptimizerConfig,
    Upload,
)

if TYPE_CHECKING:
    import torch

# sub-stream of the client's round-free stream (keys: client) that draws its validation share
VALIDATION_STREAM = 0xD170


class DittoParams(Section):
    """The personal model's training: its epochs, its proximal pull towards the global
    model, and how that pull's strength lambda is chosen."""

    lambda_selection: Literal["per_client", "fixed"] = Field(
        "per_client",
        description="per_client: each client picks lambda from lambda_candidates on its own validation share "
        "(the paper's rule); fixed: every client uses proximal",
    )
    lambda_candidates: list[float] = Field(
        [0.01, 0.1, 1.0, 2.0],
        min_length=1,
        description="per_client: the lambdas tried, one personal model each; each costs one more personal "
        "training per sampled round (4 cost about 4.2x FedAvg's local training, fixed 2x)",
    )
    validation_fraction: float = Field(
        0.2,
        gt=0.0,
        lt=0.5,
        description="per_client: share of each class of a client's training data held out to choose lambda",
    )
    proximal: float = Field(
        0.1,
        ge=0.0,
        description="lambda of (lambda/2)||v_k - w_global||^2 under lambda_selection: fixed, 0 = local training; "
        "data-dependent: calibrate it per setting",
    )
    personal_epochs: int | None = Field(
        None, ge=1, description="epochs of personal training per sampled round; null = protocol.local_epochs"
    )

    @field_validator("lambda_candidates")
    @classmethod
    def _distinct_and_not_negative(cls, values: list[float]) -> list[float]:
        if any(value < 0 for value in values):
            raise ValueError("every candidate lambda must be >= 0")
        if len(set(values)) != len(values):
            raise ValueError("candidate lambdas must be distinct")
        return values


@dataclass
class DittoClient:
    """A client's persistent personal model v_k: `model` is the one it is scored with.
    Under per-client selection `candidates` holds one v_k per candidate lambda (in
    `lambda_candidates` order; empty until the client first trains), `model` is the
    chosen one and `chosen` its lambda."""

    model: ModelParams
    candidates: tuple[ModelParams, ...] = ()
    chosen: float | None = None


def validation_split(labels: np.ndarray, fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(training indices, validation indices) of a client's samples: disjoint, together
    all of them, each sorted. Stratified: each class gives round(fraction x its count)
    random samples to validation, so with fraction < 0.5 every class keeps at least
    one training sample; a client whose classes give none (all tiny) holds out one
    random sample when it has two or more."""
    labels = np.asarray(labels)
    held: list[np.ndarray] = []
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        count = int(np.floor(fraction * members.size + 0.5))
        held.append(rng.permutation(members)[:count])
    validation = np.sort(np.concatenate(held)) if held else np.zeros(0, dtype=np.int64)
    if validation.size == 0 and labels.size >= 2:
        validation = np.array([int(rng.integers(labels.size))])
    training = np.setdiff1d(np.arange(labels.size), validation)
    return training, validation


def choose_candidate(lambdas: Sequence[float], validation: Sequence[EvalStats]) -> int:
    """Index of the best candidate: highest validation accuracy, ties to the lower
    validation loss, then to the smaller lambda. A NaN score (an empty validation
    share) ranks last, so a client without validation data takes the smallest lambda."""

    def rank(index: int) -> tuple[float, float, float]:
        stats = validation[index]
        accuracy = stats.accuracy if np.isfinite(stats.accuracy) else -np.inf
        loss = stats.loss if np.isfinite(stats.loss) else np.inf
        return (-accuracy, loss, lambdas[index])

    return min(range(len(lambdas)), key=rank)


class Ditto(FedAvg):
    name = "ditto"

    def __init__(
        self,
        params: DittoParams,
        server_optimizer: ServerOptimizerConfig = ServerOptimizerConfig(),
        privacy: ResolvedPrivacy | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(server_optimizer, privacy=privacy, seed=seed)
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

        if self.params.lambda_selection == "fixed":
            personal, personal_loss = self._train_personal(ctx, state.model, downloaded, self.params.proximal, data=None)
            new_state, values = DittoClient(model=personal), {"personal_loss": personal_loss}
        else:
            new_state, values = self._train_candidates(ctx, state, downloaded)
        if "clip" in task.payload:  # privacy: the global model's clipped update; v_k and lambda stay here
            clip = float(task.payload["clip"])
            update, norm = clipped_update(downloaded, global_update, clip, with_head=True)
            loss = global_stats.mean_loss if np.isfinite(values["personal_loss"]) else float("nan")
            return private_upload(ctx.client_id, global_stats.num_samples, loss, global_stats.steps, update, norm, clip), new_state
        upload = Upload(
            client_id=ctx.client_id,
            num_samples=global_stats.num_samples,
            train_loss=global_stats.mean_loss,  # the global model's, as FedAvg logs it
            steps=global_stats.steps,
            models={"model": global_update},
            values=values,
        )
        return upload, new_state

    def _train_personal(
        self, ctx: ClientContext, start: ModelParams, downloaded: ModelParams, strength: float, data: Any, epochs: int | None = None
    ) -> tuple[ModelParams, float]:
        """One personal model trained from `start` with pull `strength` on `data` (None:
        the whole training data) for `epochs` (None: personal_epochs); its mean loss, NaN if
        the training diverged."""
        regulariser = None
        if strength > 0:
            regulariser = proximal_regulariser(ctx, [downloaded], np.ones(1), strength)
        ctx.load(start)
        stats = ctx.train(epochs=self.params.personal_epochs if epochs is None else epochs, regulariser=regulariser, data=data)
        personal = ctx.snapshot()
        # v_k never travels, so the runtime's check of uploads cannot see it: a diverged personal
        # training reports a NaN loss, and the runtime then refuses the whole update (v_k included)
        diverged = stats.nonfinite or not personal.is_finite()
        return personal, float("nan") if diverged else stats.mean_loss

    def _train_candidates(
        self, ctx: ClientContext, state: DittoClient, downloaded: ModelParams, epochs: int | None = None
    ) -> tuple[DittoClient, dict[str, float]]:
        """Every candidate's v_k trained on the training share, the best on the validation share chosen."""
        lambdas = self.params.lambda_candidates
        # a client that has not trained yet (or a state from before per-client selection) starts
        # every candidate from its one personal model
        starts = state.candidates or tuple(state.model for _ in lambdas)
        if len(starts) != len(lambdas):
            raise ValueError(f"client {ctx.client_id} holds {len(starts)} personal models for {len(lambdas)} candidate lambdas")
        training, validation = self.split(ctx)
        trained, losses = [], []
        for start, strength in zip(starts, lambdas):
            personal, loss = self._train_personal(ctx, start, downloaded, strength, data=training, epochs=epochs)
            trained.append(personal)
            losses.append(loss)
        scores = [ctx.score(personal, data=validation) for personal in trained]
        best = choose_candidate(lambdas, scores)
        new_state = DittoClient(model=trained[best], candidates=tuple(trained), chosen=float(lambdas[best]))
        # any diverged candidate makes the update non-finite, so the runtime refuses it whole
        personal_loss = losses[best] if all(np.isfinite(losses)) else float("nan")
        return new_state, {"personal_loss": personal_loss, "lambda": float(lambdas[best])}

    def split(self, ctx: ClientContext) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """The client's (training share, validation share) of its training data, fixed by
        the run seed and the client id (not the round)."""
        import torch  # client side only: the server never imports torch

        inputs, labels = ctx.train_data()
        rng = seeding.rng(ctx.seed, "client", ctx.client_id, sub=VALIDATION_STREAM)
        training, validation = validation_split(labels.cpu().numpy(), self.params.validation_fraction, rng)
        shares = []
        for indices in (training, validation):
            picked = torch.as_tensor(indices, dtype=torch.long, device=labels.device)
            shares.append((inputs[picked], labels[picked]))
        return shares[0], shares[1]

    def aggregate(self, state: GlobalModelState, round_index: int, uploads: list[Upload]) -> RoundNotes:
        notes = super().aggregate(state, round_index, uploads)
        chosen = {upload.client_id: float(upload.values["lambda"]) for upload in uploads if "lambda" in upload.values}
        if not chosen:
            return notes
        counts = {value: sum(1 for v in chosen.values() if v == value) for value in sorted(set(chosen.values()))}
        event = (
            "ditto: lambda chosen on local validation "
            + "; ".join(f"{value:g} x{count}" for value, count in counts.items())
            + " (client: lambda "
            + ", ".join(f"{client}: {value:g}" for client, value in sorted(chosen.items()))
            + ")"
        )
        return RoundNotes(refresh=notes.refresh, events=(*notes.events, event))

    def evaluate(
        self, ctx: ClientContext, state: DittoClient, task: ClientTask, objects: Mapping[str, Any], final: bool
    ) -> EvalResult:
        return EvalResult(
            references={"personalized": ctx.score(state.model), "global": ctx.score(objects["global"])},
            headline="personalized",
        )

    # ---- newcomers (partition.newcomers): a personal model from the global one, for the budget ----
    def evaluate_newcomer(self, ctx: ClientContext, state: DittoClient, task: ClientTask, objects: Mapping[str, Any], epochs: int) -> EvalResult:
        """v starts from the downloaded global model (the shared part) and trains `epochs` epochs on
        Ditto's personal objective, lambda chosen as a trained client chooses it."""
        downloaded: ModelParams = objects["global"]
        personal = downloaded
        if epochs > 0 and self.params.lambda_selection == "fixed":
            personal, _ = self._train_personal(ctx, downloaded, downloaded, self.params.proximal, data=None, epochs=epochs)
        elif epochs > 0:
            personal = self._train_candidates(ctx, DittoClient(model=downloaded), downloaded, epochs=epochs)[0].model
        return EvalResult(references={"personalized": ctx.score(personal), "global": ctx.score(downloaded)}, headline="personalized")


METHOD = MethodSpec(
    name="ditto",
    summary="Ditto: FedAvg's global model plus a personal model per client, pulled towards the global one",
    params=DittoParams,
    build=lambda params, run: Ditto(params, run.server_optimizer, privacy=run.privacy, seed=run.seed),
    applies_server_optimizer=True,
    newcomer_rule="a personal model from the global model, trained for protocol.newcomer_epochs epochs on Ditto's "
    "objective CE + (lambda/2)||v - w||^2 (lambda fixed, or chosen per client on its validation share)",
    privacy=PrivacyRule(
        sends="the global model's update (encoder and head), clipped: one noised mean a round",
        kept_on_client="the personal model v_k (every candidate's), the chosen lambda and the personal training's loss",
    ),
)
