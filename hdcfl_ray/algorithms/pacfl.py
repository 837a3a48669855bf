"""PACFL: one-shot clustering of clients by the angles between their data
subspaces, then FedAvg inside each cluster (docs/baselines.md, PACFL).

- Round 1 only: every client sends a basis of its raw training images (uint8
  after its rotation, no normalisation, no augmentation; `subspaces.client_basis`).
  The server computes the proximity matrix, clusters it agglomeratively with a
  distance threshold (the number of clusters is discovered) and never re-clusters.
- Every cluster model starts from the one shared initial model and is a full
  model (encoder and head), so the client's private head is unused.
- Each round a participant trains its cluster's model; the server averages within
  each cluster; clusters without participants are unchanged.
- Logged once: the clusters found, their sizes, the threshold with its unit and
  the smallest and median pairwise angle, for calibrating `algorithm.pacfl.threshold`;
  a threshold that merges every client into one cluster (PACFL is then FedAvg) is
  called out. ARI against the planted groups comes from the evaluation `group`.
- Linkage "average" is the reference's mean-of-rows rule, i.e. scipy "weighted"
  (WPGMA), not scipy "average" (UPGMA); see `subspaces.SCIPY_LINKAGE`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Mapping

import numpy as np
from pydantic import Field

from hdcfl_ray.algorithms.cluster_models import (
    average_within_clusters,
    cluster_object_name,
    cluster_objects,
    cluster_sizes,
    copy_model,
    members_from_uploads,
    train_cluster_model,
)
from hdcfl_ray.algorithms.defaults import AlgorithmDefaults
from hdcfl_ray.maths.server_optimizer import ServerMoments, server_step_clusters
from hdcfl_ray.algorithms.pacfl_subspaces import (
    SCIPY_LINKAGE,
    agglomerative_clusters,
    angles_to,
    client_basis,
    data_matrix,
    off_diagonal_summary,
    proximity_matrix,
    threshold_in_radians,
)
from hdcfl_ray.contract import AutoKnob, ClientContext, ClientTask, EvalResult, MethodSpec, ModelParams, RoundNotes, RunInfo, Section, Upload


class PACFLParams(Section):
    """One-shot clustering on the angles between clients' data subspaces (docs/baselines.md, PACFL)."""

    basis_dim: int = Field(3, ge=1, description="p singular vectors per class (or for the whole data)")
    basis: Literal["per_class", "whole"] = Field("per_class", description="a basis per class, or one for the whole local data")
    threshold: Annotated[float, Field(gt=0.0)] | Literal["auto"] = Field(
        "auto",
        description="clusters merge below this angle; auto = chosen before the run on held-out training images among "
        "0.001 and 0.25-32 degrees, from one cluster per client (local training) to one cluster (docs/calibration.md)",
    )
    threshold_unit: Literal["radians", "degrees"] = Field("radians", description="unit of threshold")
    proximity: Literal["principal", "elementwise"] = Field(
        "principal", description="principal angles (arccos of singular values of U_i^T U_j) or the reference's element-wise min arccos"
    )
    linkage: Literal["average", "weighted", "complete", "single"] = Field("average", description="agglomerative linkage")


# `threshold: auto`'s candidates, in degrees: a floor below any angle between two
# clients holding different images (every client its own cluster: each trains alone,
# as Local does), then doubling angles from below the smallest pairwise
# angles measured (0.4 degrees on digits; per-class bases on all of CIFAR-10 keep every
# pair within 1.4 degrees) to one that merges every client of the settings measured
# (digits' largest pairwise angles stay below 28 degrees): one cluster, FedAvg
AUTO_THRESHOLD_DEGREES = (0.001, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)


def auto_thresholds(params: PACFLParams) -> tuple[float, ...]:
    """The candidates of `threshold: auto` in the section's `threshold_unit`."""
    if params.threshold_unit == "degrees":
        return AUTO_THRESHOLD_DEGREES
    return tuple(float(np.deg2rad(degrees)) for degrees in AUTO_THRESHOLD_DEGREES)


# Below this median angle the clients' subspaces are indistinguishable in practice
# (e.g. p * classes basis vectors in a space of few pixels); the merge event says so.
_NEAR_ZERO_RADIANS = 1e-3


@dataclass
class PACFLState:
    initial: ModelParams
    models: list[ModelParams]  # one per cluster; empty until the clustering round
    labels: dict[int, int] | None = None  # client -> cluster, fixed once set
    proximity: np.ndarray | None = None  # radians, client order
    # every probed client's data subspace basis, kept only in a run with newcomers (placed by it)
    bases: dict[int, np.ndarray] | None = None
    server_moments: ServerMoments = field(default_factory=dict)  # protocol.server_optimizer's state, per cluster


class PACFL(AlgorithmDefaults):
    name = "pacfl"

    def __init__(self, params: PACFLParams, run: RunInfo) -> None:
        self.params = params
        self.server_optimizer = run.server_optimizer
        self.threshold_radians = threshold_in_radians(params.threshold, params.threshold_unit)
        self.keep_bases = bool(run.newcomers)  # a newcomer joins the cluster of the nearest stored subspace
        if params.linkage not in SCIPY_LINKAGE:
            raise ValueError(f"algorithm.pacfl.linkage: {params.linkage!r} is not supported (choose {', '.join(SCIPY_LINKAGE)})")

    # ---- server ----
    def init_server(self, initial: ModelParams, independent: list[ModelParams], num_clients: int) -> PACFLState:
        return PACFLState(initial=copy_model(initial), models=[])

    def probe_task(self, state: PACFLState, round_index: int, client_id: int) -> ClientTask | None:
        # One shot: bases are asked for until the clustering exists (round 1), never after.
        return ClientTask() if state.labels is None else None

    def absorb_probes(self, state: PACFLState, round_index: int, results: Mapping[int, Mapping[str, Any]]) -> RoundNotes:
        if state.labels is not None or not results:
            return RoundNotes()
        client_ids = sorted(results)
        proximity = proximity_matrix([np.asarray(results[k]["basis"]) for k in client_ids], self.params.proximity)
        labels = agglomerative_clusters(proximity, self.threshold_radians, self.params.linkage)
        state.proximity = proximity
        state.labels = {k: int(labels[i]) for i, k in enumerate(client_ids)}
        if self.keep_bases:
            state.bases = {k: np.asarray(results[k]["basis"]) for k in client_ids}
        count = int(labels.max()) + 1 if labels.size else 0
        state.models = [copy_model(state.initial) for _ in range(count)]
        return RoundNotes(events=self._clustering_events(proximity, labels, count))

    def _threshold_text(self) -> str:
        if self.params.threshold_unit == "degrees":
            return f"{self.params.threshold:g} degrees ({self.threshold_radians:.4g} radians)"
        return f"{self.params.threshold:g} radians ({np.rad2deg(self.threshold_radians):.4g} degrees)"

    def _clustering_events(self, proximity: np.ndarray, labels: np.ndarray, count: int) -> tuple[str, ...]:
        params = self.params
        smallest, median = off_diagonal_summary(proximity)
        spread = f"pairwise proximity smallest {smallest:.4g} rad, median {median:.4g} rad"
        events = [
            f"PACFL: {count} cluster(s) from {labels.size} client subspaces, sizes {cluster_sizes(labels.tolist(), count)}; "
            f"basis {params.basis} p={params.basis_dim}, proximity {params.proximity}, "
            f"linkage {params.linkage} (scipy {SCIPY_LINKAGE[params.linkage]}), threshold {self._threshold_text()}; "
            f"{spread}; clusters fixed from now on, all starting from one shared initial model",
        ]
        if count == 1 and labels.size > 1:
            merged = (
                f"PACFL: threshold {self._threshold_text()} merges all {labels.size} clients into one cluster, so PACFL "
                f"reduces to FedAvg ({spread}); to split them set algorithm.pacfl.threshold below the median "
                "(in the unit of algorithm.pacfl.threshold_unit)"
            )
            if median < _NEAR_ZERO_RADIANS:
                merged += (
                    "; angles this close to zero mean the bases nearly fill the data space "
                    "(try algorithm.pacfl.basis: whole or algorithm.pacfl.proximity: elementwise)"
                )
            events.append(merged)
        return tuple(events)

    def _labels(self, state: PACFLState) -> dict[int, int]:
        if state.labels is None:
            raise RuntimeError("PACFL has no clusters yet: the round-1 subspace probe did not run")
        return state.labels

    def broadcast(self, state: PACFLState, round_index: int) -> dict[str, Any]:
        return cluster_objects(state.models)

    def training_task(self, state: PACFLState, round_index: int, client_id: int) -> ClientTask:
        cluster = self._labels(state)[client_id]
        return ClientTask(models=(cluster_object_name(cluster),), payload={"cluster": cluster})

    def aggregate(self, state: PACFLState, round_index: int, uploads: list[Upload]) -> RoundNotes:
        labels = self._labels(state)
        members = members_from_uploads(uploads, lambda upload: labels[upload.client_id])
        averaged = average_within_clusters(state.models, members)
        trained = {member.cluster for member in members}
        state.models = server_step_clusters(self.server_optimizer, state.server_moments, state.models, averaged, trained)
        sizes = cluster_sizes([member.cluster for member in members], len(state.models))
        return RoundNotes(events=(f"PACFL round {round_index}: participants per cluster {sizes}",))

    def evaluation_task(self, state: PACFLState, round_index: int, client_id: int, final: bool) -> ClientTask:
        return self.training_task(state, round_index, client_id)

    # ---- client ----
    def init_client(self, client_id: int, initial: ModelParams) -> None:
        return None  # nothing private: the basis is sent once, the model is the cluster's

    def probe(self, ctx: ClientContext, state: None, task: ClientTask, objects: Mapping[str, Any]) -> Mapping[str, Any]:
        images, labels = ctx.raw_train()
        return {"basis": client_basis(data_matrix(images), labels, self.params.basis_dim, self.params.basis)}

    def local_update(self, ctx: ClientContext, state: None, task: ClientTask, objects: Mapping[str, Any]) -> tuple[Upload, None]:
        cluster = int(task.payload["cluster"])
        return train_cluster_model(ctx, objects[cluster_object_name(cluster)], cluster), None

    def evaluate(self, ctx: ClientContext, state: None, task: ClientTask, objects: Mapping[str, Any], final: bool) -> EvalResult:
        cluster = int(task.payload["cluster"])
        stats = ctx.score(objects[cluster_object_name(cluster)])
        return EvalResult(references={"personalized": stats}, headline="personalized", group=cluster)

    # ---- newcomers (partition.newcomers): its subspace, then the nearest stored subspace's cluster ----
    def newcomer_probe_task(self, state: PACFLState, round_index: int, client_id: int) -> ClientTask | None:
        return ClientTask()  # the round-1 probe: the newcomer's basis, answered by `probe`

    def newcomer_task(self, state: PACFLState, round_index: int, client_id: int, probe: Mapping[str, Any] | None) -> ClientTask:
        if probe is None or state.bases is None or not state.bases:
            raise RuntimeError("PACFL places a newcomer by its subspace: it needs its probe and the stored subspaces")
        cluster = nearest_cluster(np.asarray(probe["basis"]), state.bases, self._labels(state), self.params.proximity)
        return ClientTask(models=(cluster_object_name(cluster),), payload={"cluster": cluster})

    def evaluate_newcomer(self, ctx: ClientContext, state: None, task: ClientTask, objects: Mapping[str, Any], epochs: int) -> EvalResult:
        return self.evaluate(ctx, state, task, objects, final=False)


def nearest_cluster(basis: np.ndarray, bases: Mapping[int, np.ndarray], labels: Mapping[int, int], proximity: str) -> int:
    """The cluster of the stored client subspace at the smallest angle to `basis` (ties to
    the lower client id): a probed client's own basis gives its own cluster."""
    client_ids = sorted(bases)
    angles = angles_to(basis, [bases[k] for k in client_ids], proximity)  # type: ignore[arg-type]
    return int(labels[client_ids[int(np.argmin(angles))]])


def clustering_of(params: PACFLParams, state: PACFLState, threshold: float) -> tuple[int, ...]:
    """The clusters `threshold` cuts the clients' subspaces into, given the proximity the
    round-1 probes measured (as a canonical labelling): thresholds with one clustering give
    one run, so `auto` trains them once."""
    if state.proximity is None:
        raise RuntimeError("PACFL has no proximity yet: the round-1 subspace probe did not run")
    labels = agglomerative_clusters(state.proximity, threshold_in_radians(threshold, params.threshold_unit), params.linkage)
    first_seen: dict[int, int] = {}
    return tuple(first_seen.setdefault(int(label), len(first_seen)) for label in labels)


METHOD = MethodSpec(
    name="pacfl",
    summary="PACFL: one-shot clustering on the angles between the clients' data subspaces",
    params=PACFLParams,
    build=lambda params, run: PACFL(params, run),
    applies_server_optimizer=True,
    auto_knobs=(AutoKnob("threshold", auto_thresholds, same_run_key=clustering_of),),
    newcomer_rule="its data subspace (sent up as PACFL's round-1 probe) joins the cluster of the stored subspace at the "
    "smallest angle; that cluster's model, untrained",
    no_privacy_reason="its one-shot clustering sends a basis of each client's raw training images, which needs a private subspace release first",
)
