"""FedSoft: S soft cluster centres, one persistent personal model w_k per client,
and a proximal pull of every w_k toward all centres weighted by the client's
importance weights u_k (docs/baselines.md, FedSoft).

Choices made here, each documented where it acts:
- Full models: centres and w_k are encoder plus head, as for every clustered
  method (docs/baselines.md, "What is common to all methods"); the private head
  of the shared-encoder methods is unused. Centres start from S independently
  seeded models (logged at round 1); every w_k starts from the shared initial model.
- Importance estimation runs for every client at round 1 (so u exists before the
  first local update) and then whenever t mod tau == 0. u_k is renormalised to
  sum to one after smoothing (see `fedsoft_importance.importance_weights`).
- Aggregation over every client. In "sampled" and "all_clients" modes the
  server keeps each client's latest personal model w_k (the shared initial model
  until the client's first upload, then its last upload) and sets
  c_s = sum_k v_{s,k} w_k over all K clients, v = `server_weights(u, n)`
  (`fedsoft_centres.soft_centres`). A client's w_k changes only when it trains,
  so this is the centre FedSoft's reference computes from all clients' current
  models, whichever of them trained this round. Memory: K full models on the
  server (one shared copy until clients first upload), plus the S centres; they
  are part of the server state and so of every checkpoint. "select" mode keeps
  no client models.
- Selection. "sampled" (default): the runtime's uniform per-round sample
  trains, so FedSoft spends the same local budget as every other method.
  "select": each centre draws K_sel distinct clients with probabilities v_{s,.}
  from the online clients, the union trains (its size is logged; the budget can
  exceed the others') and c_s is the plain mean of its draws. "all_clients":
  every online client trains every round (the reference's schedule without
  selection; about 1/participation times the budget, so reports label it
  fedsoft-all).
- lambda (`proximal`) defaults to 0.01. Under the local optimiser the proximal
  gradient lambda * sum_s u_s (w - c_s) is scaled by the learning rate and the
  momentum exactly as the data gradient is, so the point local training moves
  toward (the stationary point of CE + lambda/2 sum_s u_s ||w - c_s||^2, plus
  the weight decay) does not depend on lr or momentum; how strongly lambda
  should tie w_k to the centres depends on the data and the model. It is chosen
  per setting with `hdcfl-ray calibrate` on held-out validation data
  (docs/calibration.md), like the other methods' data-dependent knobs.
- Newcomers (partition.newcomers) never train: their n_k is 0, so they carry no weight in
  any centre (v_{s,k} = 0); `evaluate_newcomer` places one by its own importance estimate.
- The proximal term covers model parameters only; BatchNorm running statistics
  are not pulled, but they are averaged into the centres with everything else.
- Under privacy (docs/privacy.md, "FedSoft") the server keeps no client model and sends
  no probe. A client estimates u_k itself from the centres whenever it trains and sends
  one clipped update of w_k per centre, w_k - c_s, with u_k; every centre's u-weighted sum
  of its updates with its u-weighted count is one noised release
  (`released_per_group_means`), so centre s moves to the u_s-weighted mean of the clients'
  (clipped) models as FedSoft's centres are, and the server neither stores nor logs u_k. Only
  selection_mode: sampled runs: the other modes choose the clients in place of the
  Poisson sample. An evaluated client places itself by its own estimate, on the client.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Mapping

import numpy as np
from pydantic import Field

from hdcfl_ray import seeding
from hdcfl_ray.maths.aggregate import weighted_average_model
from hdcfl_ray.algorithms.defaults import AlgorithmDefaults
from hdcfl_ray.maths.server_optimizer import ServerMoments, server_step_clusters
from hdcfl_ray.algorithms.fedsoft_centres import kept_copy, soft_centres, starting_models
from hdcfl_ray.algorithms.fedsoft_importance import argmin_counts, importance_weights, select_per_centre, server_weights
from hdcfl_ray.algorithms.newcomer_training import fine_tuned
from hdcfl_ray.algorithms.private_updates import WITHIN_CLIP, ClipState, clipped_update, group_update_key, stepped_by_soft_release
from hdcfl_ray.algorithms.proximal import proximal_regulariser
from hdcfl_ray.contract import AutoKnob, doubled_count, tenfold, ClientContext, ClientTask, EvalResult, MethodSpec, ModelParams, PrivacyRule, ResolvedPrivacy, RoundNotes, RunInfo, Section, Upload
from hdcfl_ray.errors import ScenarioError


class FedSoftParams(Section):
    """S soft cluster centres and a proximal pull of each personal model (docs/baselines.md, FedSoft)."""

    centers: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        "auto",
        description="S cluster centres; auto = chosen before the run on held-out training images among 2, 4, 10, "
        "after proximal (docs/calibration.md)",
    )
    # data-dependent: set per setting with `hdcfl-ray calibrate` on held-out validation data
    # (docs/calibration.md); lr and momentum scale the pull and the data gradient alike
    proximal: Annotated[float, Field(ge=0.0)] | Literal["auto"] = Field(
        "auto",
        description="lambda of the proximal pull towards the centres; auto = chosen before the run on held-out "
        "training images among 0.001, 0.01, 0.1 (at 3 centres when centers is auto too) (docs/calibration.md)",
    )
    importance_every: int = Field(2, ge=1, description="tau: rounds between importance estimates")
    smoothing: float = Field(1.0e-4, ge=0.0, description="sigma: floor on the importance counts")
    selection: int = Field(20, ge=1, description="K_sel clients per centre (selection_mode: select)")
    # "sampled": the runtime's per-round sample trains (every method's budget); "all_clients": every
    # online client trains every round (about 1/participation times the budget; reported as its own
    # method, fedsoft-all); in both, c_s = sum_k v_sk w_k over every client's latest model.
    # "select": each centre draws K_sel clients with probabilities v_s (the union trains) and is the
    # plain mean of its draws
    selection_mode: Literal["sampled", "select", "all_clients"] = Field(
        "sampled", description="who trains: the round's sample, K_sel clients per centre, or every online client"
    )


def centre_name(index: int) -> str:
    return f"center_{index}"


@dataclass
class FedSoftState:
    centres: list[ModelParams]
    num_clients: int
    weighted: bool  # True: importance-weighted aggregation of the uploads; False: per-centre selection
    importance: np.ndarray  # u, (K, S), rows sum to one
    num_samples: np.ndarray  # n_k, (K,)
    weights: np.ndarray  # v, (S, K), rows sum to one
    selections: list[np.ndarray] | None = None  # this round's clients per centre (selection mode)
    # w_k, every client's latest personal model (the shared initial model before its first upload),
    # kept when `weighted`: K full models on the server. None in selection mode.
    clients: list[ModelParams] | None = None
    server_moments: ServerMoments = field(default_factory=dict)  # protocol.server_optimizer's state, per centre
    clip: ClipState | None = None  # under privacy: the clip the clients use this round


# Upload.values key under privacy: the client's importance weights u_k, the weights of its update in the release
IMPORTANCE = "importance"


@dataclass
class FedSoftClient:
    """A client's persistent personal model w_k."""

    model: ModelParams


class FedSoft(AlgorithmDefaults):
    name = "fedsoft"

    def __init__(self, params: FedSoftParams, run: RunInfo) -> None:
        self.params = params
        self.seed = run.seed
        self.server_optimizer = run.server_optimizer
        self.independent_inits = params.centers
        self.newcomers = run.newcomers  # never train: no weight in any centre
        self.privacy: ResolvedPrivacy | None = run.privacy
        if self.privacy is not None and params.selection_mode != "sampled":
            raise ValueError(
                f"algorithm.fedsoft.selection_mode: {params.selection_mode} under privacy: it chooses the round's clients "
                "itself (select: by the importance weights the server would have to hold; all_clients: every client), in "
                "place of the Poisson sample the accountant assumes; set selection_mode: sampled, or remove the privacy section"
            )

    def is_importance_round(self, round_index: int) -> bool:
        return round_index == 1 or round_index % self.params.importance_every == 0

    def centre_names(self) -> tuple[str, ...]:
        return tuple(centre_name(s) for s in range(self.params.centers))

    # ---- server ----
    def init_server(self, initial: ModelParams, independent: list[ModelParams], num_clients: int) -> FedSoftState:
        if len(independent) != self.params.centers:
            raise ValueError(f"FedSoft needs {self.params.centers} independent centres, got {len(independent)}")
        weighted = self.params.selection_mode != "select"
        centres = self.params.centers
        importance = np.full((num_clients, centres), 1.0 / centres)
        num_samples = np.ones(num_clients)
        num_samples[list(self.newcomers)] = 0.0  # v_{s,k} = 0: a newcomer's model never enters a centre
        return FedSoftState(
            centres=[ModelParams(np.array(m.encoder, dtype=np.float32), np.array(m.head, dtype=np.float32)) for m in independent],
            num_clients=num_clients,
            weighted=weighted,
            importance=importance,
            num_samples=num_samples,
            weights=server_weights(importance, num_samples),
            # under privacy the server keeps no client model: the centres move by noised sums of updates
            clients=starting_models(initial, num_clients) if weighted and self.privacy is None else None,
            clip=None if self.privacy is None else ClipState(self.privacy.clip),
        )

    def startup_events(self, state: FedSoftState) -> tuple[str, ...]:
        k, k_sel = state.num_clients, self.params.selection
        events = [
            f"fedsoft: {self.params.centers} centres start from independently seeded models (symmetry breaking); "
            "client models start from the shared initial model"
        ]
        mode = self.params.selection_mode
        if mode == "sampled":
            events.append(
                "fedsoft: selection_mode=sampled: the runtime's per-round sample trains, "
                "c_s = sum_k v_sk w_k over every client's latest model"
            )
        elif mode == "all_clients":
            events.append(
                "fedsoft: selection_mode=all_clients: every online client trains every round, "
                "c_s = sum_k v_sk w_k over every client's latest model"
            )
        else:
            events.append(
                f"fedsoft: per-centre selection of {min(k_sel, k)} of {k} clients drawn with probabilities v_s "
                "(the uniform per-round sample is not used)"
            )
            if k_sel >= k:
                events.append(f"fedsoft: warning: selection {k_sel} >= {k} clients: every centre selects all clients")
        return tuple(events)

    def probe_task(self, state: FedSoftState, round_index: int, client_id: int) -> ClientTask | None:
        if self.privacy is not None:  # each client estimates its importance when it trains, on the client
            return None
        return ClientTask(models=self.centre_names()) if self.is_importance_round(round_index) else None

    def absorb_probes(self, state: FedSoftState, round_index: int, results: Mapping[int, Mapping[str, Any]]) -> RoundNotes:
        for client_id in sorted(results):
            state.importance[client_id] = np.asarray(results[client_id]["importance"], dtype=np.float64)
            state.num_samples[client_id] = float(results[client_id]["num_samples"])
        state.weights = server_weights(state.importance, state.num_samples)
        dominant = np.bincount(np.argmax(state.importance, axis=1), minlength=self.params.centers)
        events = self.startup_events(state) if round_index == 1 else ()
        return RoundNotes(events=(*events, f"fedsoft: importance re-estimated; clients per dominant centre {dominant.tolist()}"))

    def select(self, state: FedSoftState, round_index: int, sampled: list[int], online: list[int]) -> list[int]:
        """The runtime's sample ("sampled"), every online client ("all_clients"), or
        per-centre draws among the online clients ("select")."""
        if state.weighted:
            state.selections = None
            return sorted(online) if self.params.selection_mode == "all_clients" else sorted(sampled)
        rng = seeding.rng(self.seed, "fedsoft_selection", round_index)
        weights = np.zeros_like(state.weights)
        weights[:, online] = state.weights[:, online]
        state.selections = select_per_centre(weights, min(self.params.selection, state.num_clients), rng)
        return sorted({int(k) for chosen in state.selections for k in chosen})

    def broadcast(self, state: FedSoftState, round_index: int) -> dict[str, Any]:
        return {centre_name(s): centre for s, centre in enumerate(state.centres)}

    def training_task(self, state: FedSoftState, round_index: int, client_id: int) -> ClientTask:
        if state.clip is not None:
            return ClientTask(models=self.centre_names(), payload={"clip": state.clip.clip})
        return ClientTask(models=self.centre_names(), payload={"importance": state.importance[client_id].copy()})

    def aggregate(self, state: FedSoftState, round_index: int, uploads: list[Upload]) -> RoundNotes:
        if self.privacy is not None and state.clip is not None:
            return self._aggregate_private(self.privacy, state, state.clip, round_index, uploads)
        by_client = {upload.client_id: upload for upload in uploads}
        if state.selections is not None:
            return self._aggregate_selected(state, by_client)
        if state.clients is None:
            raise ScenarioError(
                "fedsoft: this server state keeps no client models (a checkpoint written before FedSoft kept every "
                "client's latest model): it cannot be resumed by this version; start the run again without --resume"
            )
        for client_id in sorted(by_client):
            state.clients[client_id] = kept_copy(by_client[client_id].models["model"])
        events = []
        means, reached = list(state.centres), set()
        for s, centre in enumerate(soft_centres(state.weights, state.clients)):
            if centre is None:
                events.append(f"fedsoft: centre {s} has no client with positive weight; unchanged")
                continue
            means[s] = centre
            if any(state.weights[s, k] > 0 for k in by_client):  # an upload of this round entered it
                reached.add(s)
        state.centres = server_step_clusters(self.server_optimizer, state.server_moments, state.centres, means, reached)
        return RoundNotes(events=tuple(events))

    def _aggregate_selected(self, state: FedSoftState, by_client: Mapping[int, Upload]) -> RoundNotes:
        """Selection mode: each centre is the plain mean of the uploads of the clients
        drawn for it (importance already entered through the draw)."""
        assert state.selections is not None
        events = []
        means, reached = list(state.centres), set()
        for s in range(self.params.centers):
            members = [int(k) for k in state.selections[s] if int(k) in by_client]
            events.append(f"fedsoft: centre {s} selected {state.selections[s].tolist()}, averaged {len(members)}")
            if not members:
                events.append(f"fedsoft: centre {s} has no contributing upload this round; unchanged")
                continue
            means[s] = weighted_average_model(members, lambda k: by_client[k].models["model"], [1.0] * len(members))
            reached.add(s)
        state.centres = server_step_clusters(self.server_optimizer, state.server_moments, state.centres, means, reached)
        return RoundNotes(events=tuple(events))

    def _aggregate_private(
        self, privacy: ResolvedPrivacy, state: FedSoftState, clip: ClipState, round_index: int, uploads: list[Upload]
    ) -> RoundNotes:
        """Every centre's noised u-weighted sum of the clipped updates with its noised
        u-weighted count, one release; a centre whose noised count is below
        privacy.min_group_size keeps its value. Only the noised counts are logged."""
        members = [(np.asarray(upload.values[IMPORTANCE], dtype=np.float64), upload) for upload in uploads]
        state.centres, release = stepped_by_soft_release(
            privacy, clip, members, state.centres, self.server_optimizer, state.server_moments, uploads, self.seed, round_index
        )
        events: list[str] = []
        if round_index == 1:
            events.append(
                f"fedsoft under privacy: {self.params.centers} centres start from independently seeded models; each client "
                "estimates its importance from the centres whenever it trains, and centre s moves by the noised u_s-weighted "
                "mean of the clipped updates"
            )
        counts = ", ".join(f"{count:.1f}" for count in release.counts)
        events.append(f"fedsoft round {round_index}: noised centre weights [{counts}]")
        return RoundNotes(releases=(privacy.release(),), events=tuple(events))

    def evaluation_task(self, state: FedSoftState, round_index: int, client_id: int, final: bool) -> ClientTask:
        if state.clip is not None:  # the server holds no importance: the client estimates its own from the centres
            return ClientTask(models=self.centre_names())
        return ClientTask(payload={"importance": state.importance[client_id].copy()})

    # ---- client ----
    def init_client(self, client_id: int, initial: ModelParams) -> FedSoftClient:
        assert initial.head is not None
        return FedSoftClient(model=ModelParams(np.array(initial.encoder, dtype=np.float32), np.array(initial.head, dtype=np.float32)))

    def probe(self, ctx: ClientContext, state: FedSoftClient, task: ClientTask, objects: Mapping[str, Any]) -> Mapping[str, Any]:
        losses = np.stack([ctx.per_sample_losses(objects[name]) for name in task.models])
        counts = argmin_counts(losses)
        return {"importance": importance_weights(counts, self.params.smoothing), "counts": counts, "num_samples": int(counts.sum())}

    def local_update(self, ctx: ClientContext, state: FedSoftClient, task: ClientTask, objects: Mapping[str, Any]) -> tuple[Upload, FedSoftClient]:
        centres = [objects[name] for name in task.models]
        if "clip" in task.payload:
            return self._private_update(ctx, state, task, objects, centres, float(task.payload["clip"]))
        regulariser = None
        if self.params.proximal > 0:
            regulariser = proximal_regulariser(ctx, centres, np.asarray(task.payload["importance"]), self.params.proximal)
        ctx.load(state.model)  # continue from the client's own w_k, not from a centre
        stats = ctx.train(regulariser=regulariser)
        trained = ctx.snapshot()
        upload = Upload(
            client_id=ctx.client_id,
            num_samples=stats.num_samples,
            train_loss=stats.mean_loss,  # cross-entropy plus the proximal term, as minimised
            steps=stats.steps,
            models={"model": trained},
        )
        return upload, FedSoftClient(model=trained)

    def _private_update(
        self, ctx: ClientContext, state: FedSoftClient, task: ClientTask, objects: Mapping[str, Any], centres: list[ModelParams], clip: float
    ) -> tuple[Upload, FedSoftClient]:
        """Under privacy: u_k estimated here from the downloaded centres, w_k trained with
        their pull, and w_k - c_s clipped for every centre s, sent with u_k; w_k stays on the
        client."""
        importance = np.asarray(self.probe(ctx, state, task, objects)["importance"], dtype=np.float64)
        regulariser = None
        if self.params.proximal > 0:
            regulariser = proximal_regulariser(ctx, centres, importance, self.params.proximal)
        ctx.load(state.model)
        stats = ctx.train(regulariser=regulariser)
        trained = ctx.snapshot()
        # one clipped update per centre, its model minus that centre: the server moves centre s
        # to the u_s-weighted mean of the clients' models, as FedSoft's centres are
        updates = {}
        largest = 0.0
        for centre_index, centre in enumerate(centres):
            update, norm = clipped_update(centre, trained, clip, with_head=True)
            updates[group_update_key(centre_index)] = update
            largest = max(largest, norm)
        upload = Upload(
            client_id=ctx.client_id,
            num_samples=stats.num_samples,
            train_loss=stats.mean_loss,
            steps=stats.steps,
            models=updates,
            values={WITHIN_CLIP: int(largest <= clip), IMPORTANCE: importance},
        )
        return upload, FedSoftClient(model=trained)

    def evaluate(self, ctx: ClientContext, state: FedSoftClient, task: ClientTask, objects: Mapping[str, Any], final: bool) -> EvalResult:
        if "importance" in task.payload:
            importance = np.asarray(task.payload["importance"], dtype=np.float64)
        else:  # under privacy: the client's own estimate from the current centres
            importance = np.asarray(self.probe(ctx, state, task, objects)["importance"], dtype=np.float64)
        return EvalResult(
            references={"personalized": ctx.score(state.model)},
            headline="personalized",
            group=int(np.argmax(importance)),
            memberships=tuple(float(u) for u in importance),
        )

    # ---- newcomers (partition.newcomers): its importance from the centres' losses, then FedSoft's pull ----
    def newcomer_task(self, state: FedSoftState, round_index: int, client_id: int, probe: Mapping[str, Any] | None) -> ClientTask:
        return ClientTask(models=self.centre_names())

    def evaluate_newcomer(self, ctx: ClientContext, state: FedSoftClient, task: ClientTask, objects: Mapping[str, Any], epochs: int) -> EvalResult:
        """u from the per-centre losses on its training data (FedSoft's importance estimate, the
        probe every client answers); its model starts from the centre of largest u and trains
        `epochs` epochs on FedSoft's objective, the proximal pull towards every centre weighted by u."""
        centres = [objects[name] for name in task.models]
        importance = np.asarray(self.probe(ctx, state, task, objects)["importance"], dtype=np.float64)
        dominant = int(np.argmax(importance))
        regulariser = None
        if epochs > 0 and self.params.proximal > 0:
            regulariser = proximal_regulariser(ctx, centres, importance, self.params.proximal)
        model = fine_tuned(ctx, centres[dominant], epochs, regulariser=regulariser)
        return EvalResult(
            references={"personalized": ctx.score(model)},
            headline="personalized",
            group=dominant,
            memberships=tuple(float(u) for u in importance),
        )


METHOD = MethodSpec(
    name="fedsoft",
    summary="FedSoft: S soft cluster centres and a proximal pull of each personal model towards them",
    params=FedSoftParams,
    build=lambda params, run: FedSoft(params, run),
    applies_server_optimizer=True,
    extra_models="centers",
    # as docs/calibration.md chose them by hand: lambda first (at 3 centres), then the centres at the chosen lambda
    auto_knobs=(
        AutoKnob("proximal", (0.001, 0.01, 0.1), beyond=tenfold),
        AutoKnob("centers", (2, 4, 10), placeholder=3, counts_models=True, beyond=doubled_count),
    ),
    newcomer_rule="importance weights from the centres' per-sample losses on its training data; a model from the centre "
    "of largest weight, trained for protocol.newcomer_epochs epochs with the proximal pull towards the weighted centres",
    privacy=PrivacyRule(
        sends="the personal model's update against each centre c_s (encoder and head), each clipped, with the importance "
        "weights u they are weighted by: every centre's u-weighted sum with its weighted count, one noised release a round",
        kept_on_client="the personal model w_k and n_k; u_k is estimated on the client, and the server uses it only inside "
        "the noised sums",
    ),
)
