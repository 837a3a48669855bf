"""FedCE (clustering ensembles), as reconstructed in spec/baselines.md section 4.

RECONSTRUCTED: the paper's text and code were not available, so everything
below is a design choice of the spec, not a verified reproduction:
- sample-level clustering: each local training sample belongs to the cluster
  model with the lowest per-sample cross-entropy (eval mode, no grad; ties go to
  the lower index);
- mixing weights pi_{k,s} = max(n_{k,s}, sigma n_k) / sum_s max(n_{k,s}, sigma n_k),
  from the raw argmin counts;
- local training: one copy of theta_s per non-empty subset D_{k,s}, trained E
  epochs on that subset only; subsets smaller than `min_subset` (default: one
  protocol batch) are first merged into the client's largest subset, and the
  upload weights n_{k,s} are the merged subset sizes actually trained on;
- server: theta_s = sum_k n_{k,s} theta_{k,s} / sum_k n_{k,s}; a cluster with no
  uploads keeps its weights;
- personalised model: the pi_k-weighted ensemble of the cluster models, in
  output space (default: p(y|x) = sum_s pi_s softmax(f_theta_s(x))) or in
  parameter space (one model sum_s pi_s theta_s over every float entry, BatchNorm
  statistics included); pi_k is recomputed from every client's training data
  with the current models at each evaluation;
- S (default 4) and the ensemble form are guesses of the spec.
Settled by the simulator rather than the paper: cluster models are full models
(encoder plus head; the client's private head is unused), started from S
independently seeded initialisations to break symmetry (logged at round 1), and
averaged over every float entry including BatchNorm statistics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from hdcfl_ray.algorithms.aggregate import weighted_average
from hdcfl_ray.algorithms.base import ClientTask, EvalResult, ModelParams, RoundNotes, Upload
from hdcfl_ray.algorithms.defaults import AlgorithmDefaults
from hdcfl_ray.algorithms.importance import merge_small_subsets, mixing_weights, sample_assignment
from hdcfl_ray.config.schema import FedCEParams, Scenario


def cluster_name(index: int) -> str:
    return f"cluster_{index}"


@dataclass
class FedCEState:
    clusters: list[ModelParams]


@dataclass
class FedCEClient:
    """The client's mixing weights from its last training round (None before it)."""

    mixing: np.ndarray | None = None


def mix_outputs(outputs: Sequence[Any], weights: Sequence[float]) -> Any:
    """sum_s weights[s] * outputs[s]: the output-space ensemble of class
    probabilities (numpy arrays or torch tensors alike)."""
    if len(outputs) != len(weights) or not outputs:
        raise ValueError(f"need one weight per output, got {len(outputs)} outputs and {len(weights)} weights")
    mixed = outputs[0] * float(weights[0])
    for output, weight in zip(outputs[1:], weights[1:]):
        mixed = mixed + output * float(weight)
    return mixed


def aggregate_clusters(clusters: list[ModelParams], uploads: list[Upload]) -> tuple[list[ModelParams], list[int]]:
    """theta_s = n_{k,s}-weighted average of the uploads for s (in the given client
    order); clusters nobody trained are returned unchanged. Also returns the
    samples behind each cluster's update."""
    updated: list[ModelParams] = []
    samples: list[int] = []
    for s, cluster in enumerate(clusters):
        name = cluster_name(s)
        contributors = [u for u in uploads if name in u.models and int(u.values["counts"][s]) > 0]
        counts = [int(u.values["counts"][s]) for u in contributors]
        samples.append(sum(counts))
        if not contributors:
            updated.append(cluster)
            continue
        updated.append(
            ModelParams(
                encoder=weighted_average([u.models[name].encoder for u in contributors], counts),
                head=weighted_average([u.models[name].head for u in contributors], counts),
            )
        )
    return updated, samples


class FedCE(AlgorithmDefaults):
    name = "fedce"

    def __init__(self, params: FedCEParams, scenario: Scenario) -> None:
        self.params = params
        self.independent_inits = params.clusters
        self.min_subset = params.min_subset if params.min_subset is not None else scenario.protocol.batch_size

    def cluster_names(self) -> tuple[str, ...]:
        return tuple(cluster_name(s) for s in range(self.params.clusters))

    # ---- server ----
    def init_server(self, initial: ModelParams, independent: list[ModelParams], num_clients: int) -> FedCEState:
        if len(independent) != self.params.clusters:
            raise ValueError(f"FedCE needs {self.params.clusters} independent cluster models, got {len(independent)}")
        return FedCEState(clusters=[ModelParams(np.array(m.encoder, dtype=np.float32), np.array(m.head, dtype=np.float32)) for m in independent])

    def broadcast(self, state: FedCEState, round_index: int) -> dict[str, Any]:
        return {cluster_name(s): cluster for s, cluster in enumerate(state.clusters)}

    def training_task(self, state: FedCEState, round_index: int, client_id: int) -> ClientTask:
        return ClientTask(models=self.cluster_names())

    def aggregate(self, state: FedCEState, round_index: int, uploads: list[Upload]) -> RoundNotes:
        state.clusters, samples = aggregate_clusters(state.clusters, sorted(uploads, key=lambda u: u.client_id))
        events = []
        if round_index == 1:
            events += [
                f"fedce: {self.params.clusters} cluster models start from independently seeded models (symmetry breaking)",
                f"fedce: personalised model = {self.params.ensemble}-space ensemble of the cluster models weighted by pi_k; "
                f"sample subsets under {self.min_subset} merge into the client's largest subset",
            ]
        events.append(f"fedce: training samples per cluster {samples} (clusters with 0 unchanged)")
        return RoundNotes(events=tuple(events))

    def evaluation_task(self, state: FedCEState, round_index: int, client_id: int, final: bool) -> ClientTask:
        return ClientTask(models=self.cluster_names())

    # ---- client ----
    def init_client(self, client_id: int, initial: ModelParams) -> FedCEClient:
        return FedCEClient()

    def training_losses(self, ctx: Any, objects: Mapping[str, Any]) -> np.ndarray:
        """(S, N) per-sample cross-entropy of every training sample under each cluster model."""
        return np.stack([ctx.per_sample_losses(objects[name]) for name in self.cluster_names()])

    def local_update(self, ctx: Any, state: FedCEClient, task: ClientTask, objects: Mapping[str, Any]) -> tuple[Upload, FedCEClient]:
        import torch  # client side only: the server never imports torch

        inputs, labels = ctx.train_data()
        assignment = sample_assignment(self.training_losses(ctx, objects))
        num_clusters = self.params.clusters
        mixing = mixing_weights(np.bincount(assignment, minlength=num_clusters), self.params.smoothing)
        merged = merge_small_subsets(assignment, num_clusters, self.min_subset)
        counts = np.bincount(merged, minlength=num_clusters).astype(np.int64)
        trained: dict[str, ModelParams] = {}
        loss_sum, steps = 0.0, 0
        for s in range(num_clusters):
            if counts[s] == 0:
                continue
            subset = torch.as_tensor(np.flatnonzero(merged == s), device=inputs.device)
            ctx.load(objects[cluster_name(s)])
            stats = ctx.train(data=(inputs[subset], labels[subset]))
            trained[cluster_name(s)] = ctx.snapshot()
            loss_sum += stats.mean_loss * int(counts[s])
            steps += stats.steps
        upload = Upload(
            client_id=ctx.client_id,
            num_samples=int(labels.shape[0]),
            train_loss=loss_sum / max(1, int(counts.sum())),
            steps=steps,
            models=trained,
            values={"counts": counts, "mixing": mixing},
        )
        return upload, FedCEClient(mixing=mixing)

    def evaluate(self, ctx: Any, state: FedCEClient, task: ClientTask, objects: Mapping[str, Any], final: bool) -> EvalResult:
        from hdcfl_ray.runtime.client_context import stats_from_probabilities  # imports torch: client side only

        assignment = sample_assignment(self.training_losses(ctx, objects))
        mixing = mixing_weights(np.bincount(assignment, minlength=self.params.clusters), self.params.smoothing)
        models = [objects[name] for name in self.cluster_names()]
        if self.params.ensemble == "output":
            probabilities = mix_outputs([ctx.probabilities(model) for model in models], mixing)
            personalized = stats_from_probabilities(probabilities, ctx.test_data()[1])
        else:
            mixture = ModelParams(
                encoder=weighted_average([m.encoder for m in models], mixing),
                head=weighted_average([m.head for m in models], mixing),
            )
            personalized = ctx.score(mixture)
        return EvalResult(
            references={"personalized": personalized},
            headline="personalized",
            group=int(np.argmax(mixing)),
            memberships=tuple(float(p) for p in mixing),
        )
