"""S full cluster models (encoder plus head) and the rule that updates them:
a sample-weighted average over each cluster's members, clusters without
members left as they were. Shared by the clustered baselines (IFCA, PACFL).

Numpy only: these run in the server actor. Each cluster model travels as its
own broadcast object named `cluster_<j>`, so a client that needs one cluster
fetches only that one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from hdcfl_ray.maths.aggregate import weighted_average_model
from hdcfl_ray.contract import ClientContext, ModelParams, Upload

# Key under which a clustered method's client uploads its trained full model.
UPLOADED_MODEL = "model"


@dataclass(frozen=True)
class ClusterMember:
    """One upload's trained full model, which belongs to cluster `cluster`; the
    model is read from the upload when used (never held for a whole round)."""

    cluster: int
    upload: Upload

    @property
    def num_samples(self) -> int:
        return self.upload.num_samples

    @property
    def model(self) -> ModelParams:
        return self.upload.models[UPLOADED_MODEL]


def cluster_object_name(cluster: int) -> str:
    return f"cluster_{cluster}"


def cluster_object_names(count: int) -> tuple[str, ...]:
    return tuple(cluster_object_name(j) for j in range(count))


def cluster_objects(models: Sequence[ModelParams]) -> dict[str, ModelParams]:
    """The broadcast map {cluster_<j>: model j}."""
    return {cluster_object_name(j): model for j, model in enumerate(models)}


def models_from_objects(objects: Mapping[str, Any], count: int) -> list[ModelParams]:
    """Client side: the S cluster models of a broadcast, in cluster order."""
    return [objects[cluster_object_name(j)] for j in range(count)]


def copy_model(model: ModelParams) -> ModelParams:
    if model.head is None:
        raise ValueError("a cluster model is a full model: it needs a head")
    return ModelParams(
        encoder=np.array(model.encoder, dtype=np.float32, copy=True),
        head=np.array(model.head, dtype=np.float32, copy=True),
    )


def members_from_uploads(uploads: Sequence[Upload], cluster_of: Callable[[Upload], int]) -> list[ClusterMember]:
    """Uploads (each carrying its full model under UPLOADED_MODEL) as cluster
    members, in client-id order so the averages are reproducible."""
    ordered = sorted(uploads, key=lambda upload: upload.client_id)
    return [ClusterMember(int(cluster_of(u)), u) for u in ordered]


def cluster_sizes(clusters: Sequence[int], count: int) -> list[int]:
    """How many of `clusters` (one cluster index per member) fall in each of `count` clusters."""
    return np.bincount(np.asarray(clusters, dtype=np.int64), minlength=count).tolist() if len(clusters) else [0] * count


def average_within_clusters(models: Sequence[ModelParams], members: Sequence[ClusterMember]) -> list[ModelParams]:
    """theta_j <- sum n_k theta_k / sum n_k over the members of cluster j (encoder
    and head, BatchNorm statistics included); a cluster with no members keeps theta_j.
    Members are averaged in the order given."""
    count = len(models)
    for member in members:
        if not 0 <= member.cluster < count:
            raise ValueError(f"cluster index {member.cluster} is outside the {count} cluster models")
    updated = list(models)
    for cluster in range(count):
        own = [member for member in members if member.cluster == cluster]
        if not own:
            continue
        weights = [member.num_samples for member in own]
        updated[cluster] = weighted_average_model(own, lambda member: member.model, weights)
    return updated


def empty_clusters(sizes: Sequence[int]) -> list[int]:
    return [cluster for cluster, size in enumerate(sizes) if size == 0]


def train_cluster_model(ctx: ClientContext, model: ModelParams, cluster: int) -> Upload:
    """Client side of every full-model cluster method: train a copy of cluster model
    `cluster` on the local data and upload it with the cluster's index."""
    ctx.load(model)
    stats = ctx.train()
    return Upload(
        client_id=ctx.client_id,
        num_samples=stats.num_samples,
        train_loss=stats.mean_loss,
        steps=stats.steps,
        models={UPLOADED_MODEL: ctx.snapshot()},
        values={"cluster": cluster},
    )
