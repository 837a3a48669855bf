"""IFCA: S full cluster models; each client joins the one with the lowest loss on
its own data, trains it, and the server averages within clusters
(docs/baselines.md, IFCA; the model-averaging variant).

- Symmetry breaking: the S models are S independent seeded initialisations
  (encoder and head), so the first assignment is not a tie.
- Assignment: mean cross-entropy of each cluster model on a fixed random subset
  of at most `assignment_samples` of the client's training samples (the same
  subset every round, seeded by the run seed and client id), eval mode, no grad;
  argmin, ties to the lower index. The same rule on the current models picks the
  model a client is evaluated with, for every client, participants or not.
- Cluster objects are full models, so the client's private head is unused.
- Clusters that get no members keep their weights; there is no revival step.
  Sizes are logged every round, and so is how long a cluster has been empty.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Mapping, Sequence

import numpy as np
from pydantic import Field

from hdcfl_ray import seeding
from hdcfl_ray.algorithms.cluster_models import (
    average_within_clusters,
    cluster_object_names,
    cluster_objects,
    cluster_sizes,
    copy_model,
    empty_clusters,
    members_from_uploads,
    models_from_objects,
    train_cluster_model,
)
from hdcfl_ray.algorithms.defaults import AlgorithmDefaults
from hdcfl_ray.algorithms.private_updates import ClipState, clipped_update, next_round_clip, private_upload, released_group_means, shifted
from hdcfl_ray.maths.server_optimizer import ServerMoments, server_step_clusters
from hdcfl_ray.contract import (
    AutoKnob,
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
    doubled_count,
)


class IFCAParams(Section):
    """S cluster models; each client trains the one with the lowest loss (docs/baselines.md, IFCA)."""

    clusters: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        "auto", description="S cluster models; auto = chosen before the run on held-out training images among 2, 4, 10 (docs/calibration.md)"
    )
    assignment_samples: int = Field(512, ge=1, description="at most this many local training samples score the cluster models")


def assignment_subset(num_samples: int, limit: int, seed: int, client_id: int) -> np.ndarray:
    """Sorted indices of at most `limit` of a client's training samples; fixed by
    (seed, client) so the subset is the same every round."""
    if num_samples <= limit:
        return np.arange(num_samples, dtype=np.int64)
    rng = seeding.rng(seed, "ifca_assignment", client_id)
    return np.sort(rng.choice(num_samples, size=limit, replace=False)).astype(np.int64)


def choose_cluster(losses: Sequence[float]) -> int:
    """argmin_j losses[j]; ties go to the lower index; a NaN loss never wins."""
    values = np.asarray(losses, dtype=np.float64)
    if values.size == 0:
        raise ValueError("choose_cluster needs at least one loss")
    return int(np.argmin(np.where(np.isnan(values), np.inf, values)))


def cluster_losses(ctx: ClientContext, models: Sequence[ModelParams], subset: np.ndarray) -> np.ndarray:
    """Mean cross-entropy of every cluster model on the client's assignment subset."""
    inputs, labels = ctx.train_data()
    data = (inputs[subset], labels[subset])
    return np.asarray([float(np.mean(ctx.per_sample_losses(model, data=data), dtype=np.float64)) for model in models])


@dataclass
class IFCAState:
    models: list[ModelParams]
    empty_since: dict[int, int] = field(default_factory=dict)  # cluster -> first round of its current empty run
    server_moments: ServerMoments = field(default_factory=dict)  # protocol.server_optimizer's state, per cluster
    clip: ClipState | None = None  # under privacy: the clip the clients use this round


@dataclass(frozen=True)
class IFCAClient:
    """The cluster a client chose at its last training round (None before)."""

    cluster: int | None = None


class IFCA(AlgorithmDefaults):
    name = "ifca"

    def __init__(self, params: IFCAParams, run: RunInfo) -> None:
        self.params = params
        self.seed = run.seed
        self.server_optimizer = run.server_optimizer
        self.privacy: ResolvedPrivacy | None = run.privacy
        self.clusters = params.clusters
        self.independent_inits = params.clusters
        self.names = cluster_object_names(params.clusters)

    # ---- server ----
    def init_server(self, initial: ModelParams, independent: list[ModelParams], num_clients: int) -> IFCAState:
        if len(independent) != self.clusters:
            raise ValueError(f"IFCA needs {self.clusters} independent initialisations, got {len(independent)}")
        clip = None if self.privacy is None else ClipState(self.privacy.clip)
        return IFCAState(models=[copy_model(model) for model in independent], clip=clip)

    def broadcast(self, state: IFCAState, round_index: int) -> dict[str, Any]:
        return cluster_objects(state.models)

    def training_task(self, state: IFCAState, round_index: int, client_id: int) -> ClientTask:
        return ClientTask(models=self.names, payload={} if self.privacy is None else {"clip": state.clip.clip})

    def aggregate(self, state: IFCAState, round_index: int, uploads: list[Upload]) -> RoundNotes:
        if self.privacy is not None and state.clip is not None:
            return self._aggregate_private(self.privacy, state, state.clip, round_index, uploads)
        events: list[str] = []
        if round_index == 1:
            events.append(f"IFCA: {self.clusters} cluster models from {self.clusters} independent initialisations")
        members = members_from_uploads(uploads, lambda upload: int(upload.values["cluster"]))
        averaged = average_within_clusters(state.models, members)
        trained = {member.cluster for member in members}
        state.models = server_step_clusters(self.server_optimizer, state.server_moments, state.models, averaged, trained)
        sizes = cluster_sizes([member.cluster for member in members], self.clusters)
        events.append(f"IFCA round {round_index}: cluster sizes {sizes}")
        events += self._track_empty(state, round_index, sizes)
        return RoundNotes(events=tuple(events))

    def _aggregate_private(self, privacy: ResolvedPrivacy, state: IFCAState, clip: ClipState, round_index: int, uploads: list[Upload]) -> RoundNotes:
        """Each cluster's noised sum of its members' clipped updates with its noised count (one
        release: a client is in one cluster); a cluster whose noised count is below
        privacy.min_group_size keeps its model. Sizes are logged as the noised counts."""
        members = [(int(upload.values["cluster"]), upload) for upload in uploads]
        release = released_group_means(privacy, clip.clip, members, self.clusters, state.models[0], with_head=True, seed=self.seed, round_index=round_index)
        averaged = [model if mean is None else shifted(model, mean) for model, mean in zip(state.models, release.means)]
        trained = {cluster for cluster, mean in enumerate(release.means) if mean is not None}
        state.models = server_step_clusters(self.server_optimizer, state.server_moments, state.models, averaged, trained)
        clip.clip = next_round_clip(privacy, clip, uploads, self.seed, round_index)
        counts = ", ".join(f"{count:.1f}" for count in release.counts)
        return RoundNotes(releases=(privacy.release(),), events=(f"IFCA round {round_index}: noised cluster counts [{counts}]",))

    @staticmethod
    def _track_empty(state: IFCAState, round_index: int, sizes: list[int]) -> list[str]:
        empty = empty_clusters(sizes)
        for cluster in range(len(sizes)):
            if cluster in empty:
                state.empty_since.setdefault(cluster, round_index)
            else:
                state.empty_since.pop(cluster, None)
        return [
            f"IFCA: cluster {cluster} had no members (kept unchanged); empty for "
            f"{round_index - state.empty_since[cluster] + 1} round(s) since round {state.empty_since[cluster]}"
            for cluster in empty
        ]

    def evaluation_task(self, state: IFCAState, round_index: int, client_id: int, final: bool) -> ClientTask:
        return ClientTask(models=self.names)

    # ---- client ----
    def init_client(self, client_id: int, initial: ModelParams) -> IFCAClient:
        return IFCAClient()

    def _assign(self, ctx: ClientContext, models: list[ModelParams]) -> int:
        subset = assignment_subset(ctx.num_train, self.params.assignment_samples, ctx.seed, ctx.client_id)
        return choose_cluster(cluster_losses(ctx, models, subset))

    def local_update(self, ctx: ClientContext, state: IFCAClient, task: ClientTask, objects: Mapping[str, Any]) -> tuple[Upload, IFCAClient]:
        models = models_from_objects(objects, self.clusters)
        chosen = self._assign(ctx, models)
        if "clip" in task.payload:  # privacy: the clipped update of the chosen cluster's model, never the model
            clip = float(task.payload["clip"])
            ctx.load(models[chosen])
            stats = ctx.train()
            update, norm = clipped_update(models[chosen], ctx.snapshot(), clip, with_head=True)
            upload = private_upload(ctx.client_id, stats.num_samples, stats.mean_loss, stats.steps, update, norm, clip, cluster=chosen)
            return upload, IFCAClient(cluster=chosen)
        return train_cluster_model(ctx, models[chosen], chosen), IFCAClient(cluster=chosen)

    def evaluate(self, ctx: ClientContext, state: IFCAClient, task: ClientTask, objects: Mapping[str, Any], final: bool) -> EvalResult:
        models = models_from_objects(objects, self.clusters)
        chosen = self._assign(ctx, models)
        return EvalResult(references={"personalized": ctx.score(models[chosen])}, headline="personalized", group=chosen)

    # ---- newcomers (partition.newcomers): IFCA's own assignment, as at every evaluation ----
    def newcomer_task(self, state: IFCAState, round_index: int, client_id: int, probe: Mapping[str, Any] | None) -> ClientTask:
        return ClientTask(models=self.names)

    def evaluate_newcomer(self, ctx: ClientContext, state: IFCAClient, task: ClientTask, objects: Mapping[str, Any], epochs: int) -> EvalResult:
        return self.evaluate(ctx, state, task, objects, final=False)


METHOD = MethodSpec(
    name="ifca",
    summary="IFCA: S cluster models, each client trains the one with the lowest loss",
    params=IFCAParams,
    build=lambda params, run: IFCA(params, run),
    applies_server_optimizer=True,
    extra_models="clusters",
    auto_knobs=(AutoKnob("clusters", (2, 4, 10), counts_models=True, beyond=doubled_count),),
    newcomer_rule="the cluster model of lowest loss on its training data (IFCA's assignment), untrained",
    privacy=PrivacyRule(
        sends="the chosen cluster model's update (encoder and head), clipped: one noised sum per cluster with its noised "
        "count, one release a round",
        kept_on_client="nothing more: the cluster choice is made on the client, as without privacy",
    ),
)
