"""FedCE (clustering ensembles), reconstructed as a soft EM mixture of S
component models per client (docs/baselines.md, FedCE section).

RECONSTRUCTED: the paper's text and code were not available. The paper's
abstract says clustering happens at the sample level and each client's model is
an ensemble of cluster models weighted by the client's membership; everything
below is this simulator's design with those properties (FedEM-style), not a
verified reproduction:

- Server: S component models theta_1..theta_S (full models: encoder plus head).
- Client k keeps mixing weights pi_k over the components (uniform until its
  first training round).
- Participant k, every round (steps 1 and 2 in eval mode, no grad, on all its
  training samples, with the S components it was sent):
  1. membership: pi_k is EM on the mixing weights alone with the components
     fixed, pi_{k,s} <- mean over the samples of
     pi_{k,s} p_s(y | x) / sum_t pi_{k,t} p_t(y | x), floored at sigma
     (`smoothing`) and renormalised so no component is ruled out for good,
     iterated from the stored pi_k until it stops moving: the mixing weights
     under which the client's ensemble sum_s pi_{k,s} p_s(y | x) best explains
     its data. A component that explains every sample a little better takes the
     membership (one E-step from uniform would leave pi near uniform: on CIFAR
     at CPU scale the components' per-sample likelihoods differ by a few
     percent, and the single step left every membership at 0.25-0.30);
  2. tempered responsibilities, the training weights, by T (`temperature`):
     r_{k,s}(x, y) = pi_{k,s} p_s(y | x)^(1/T) / sum_t pi_{k,t} p_t(y | x)^(1/T).
     The likelihoods come from models trained on these very samples, so their
     ratios are over-confident: with T = 1 almost every sample goes wholly to
     one component, and under label skew the components split a client's
     classes between them, each confidently wrong on the classes it was not
     credited with. T > 1 keeps a client's samples shared by the components
     its membership names; T does not enter pi_k;
  3. M-step: every component s whose share m_{k,s} / n_k is at least
     `min_share` (m_{k,s} = sum_x r_{k,s}(x), the soft count) is copied and
     trained E epochs on *all* the client's samples, each sample's loss weighted
     by r_{k,s} scaled to mean one over the client (w = r n_k / m_{k,s}), so the
     local objective is the client's M-step objective sum r CE / sum r at the
     protocol's step size. A component below `min_share` explains a negligible
     part of the client's data and is neither trained nor uploaded: its soft
     count would make its weight in the server average negligible anyway, and
     the threshold bounds the scaled weights by 1 / min_share.
     Uploads carry the trained components and all S soft counts.
- Server: theta_s = sum_k m_{k,s} theta_{k,s} / sum_k m_{k,s} over the clients
  that trained s; a component nobody trained keeps its weights. With the
  mean-one weights this is FedAvg on the global M-step objective
  sum_k sum_x r CE / sum_k m_{k,s}.
- Prediction: p_k(y | x) = sum_s pi_{k,s} softmax(f_theta_s(x)) (`output`, the
  default) or one model sum_s pi_{k,s} theta_s (`parameter`). At evaluation pi_k
  is refreshed as in step 1 from the stored pi_k (uniform before the client's
  first round) on the client's training data with the current models, for every
  client, participant or not; the refreshed pi_k is not stored.
- Initialisation: component 0 starts from the shared seeded initial model (the
  one FedAvg starts from) and components 1..S-1 from independently seeded
  models (symmetry breaking, logged at round 1).

Under privacy (docs/privacy.md, "FedCE") a client sends, for every component it trained,
the clipped update of that component (its trained copy minus the component it
downloaded) and its shares m_{k,s} / n_k (zero for the components it did not train; they
sum to at most one). Every component's share-weighted sum of its updates with its
share-weighted count is one noised release (`released_per_group_means`, as FedSoft's
centres), so component s moves by the noised share-weighted mean of the clipped updates:
each client counts once in all, by its shares, instead of by its soft counts (n_k stays on
the client). pi_k never leaves the client.

With S = 1 pi_k = (1) and every responsibility is exactly 1 (whatever T), training runs
unweighted and the single model is scored directly, so FedCE is FedAvg bit for
bit. Cost: S forward passes over the training set per local update and per
evaluation, and up to S local trainings per participant (counted in the
training budget). Averages run over every float entry, BatchNorm statistics
included. Measurements and the designs this one replaced: docs/baselines.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Mapping, Sequence

import numpy as np
from pydantic import Field

from hdcfl_ray.maths.aggregate import weighted_average, weighted_average_model
from hdcfl_ray.algorithms.cluster_models import cluster_object_name, cluster_object_names, copy_model, models_from_objects
from hdcfl_ray.algorithms.defaults import AlgorithmDefaults
from hdcfl_ray.algorithms.private_updates import WITHIN_CLIP, ClipState, clipped_update, group_update_key, stepped_by_soft_release
from hdcfl_ray.maths.server_optimizer import ServerMoments, server_step_clusters
from hdcfl_ray.contract import (
    AutoKnob,
    doubled_count,
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


class FedCEParams(Section):
    """The soft EM mixture of S components per client (a reconstruction; docs/baselines.md)."""

    clusters: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        "auto",
        description="S mixture components; auto = chosen before the run on held-out training images among 2, 4 "
        "(at temperature 4 when that is auto too) (docs/calibration.md)",
    )
    smoothing: float = Field(1.0e-4, ge=0.0, le=1.0, description="sigma: floor on each mixing weight pi_{k,s}")
    min_share: float = Field(0.05, ge=0.0, le=1.0, description="a component explaining less than this share of a client's data is not trained by it")
    temperature: Annotated[float, Field(ge=1.0)] | Literal["auto"] = Field(
        "auto",
        description="T: the training weights use p_s(y|x)^(1/T) (1 = plain EM); the membership pi_k is untempered; "
        "auto = chosen before the run on held-out training images among 1, 2, 4, after clusters (docs/calibration.md)",
    )
    ensemble: Literal["output", "parameter"] = Field("output", description="the test-time ensemble averages the components' outputs or their parameters")


# ---- the mixture maths (numpy, no torch: tested without Ray) ----


def uniform_mixing(count: int) -> np.ndarray:
    return np.full(count, 1.0 / count)


def responsibilities(log_likelihoods: np.ndarray, mixing: np.ndarray) -> np.ndarray:
    """E-step: r[s, i] = pi_s p_s(y_i | x_i) / sum_t pi_t p_t(y_i | x_i).

    `log_likelihoods` is (S, N) with log p_s(y_i | x_i) (minus the per-sample
    cross-entropy); computed in log space, so a sample every model finds
    unlikely still gets a distribution. With one model every entry is 1.0."""
    logs = np.asarray(log_likelihoods, dtype=np.float64)
    weights = np.asarray(mixing, dtype=np.float64)
    if logs.ndim != 2 or weights.shape != (logs.shape[0],):
        raise ValueError(f"need (models, samples) log-likelihoods and one weight per model, got {logs.shape} and {weights.shape}")
    if logs.shape[0] == 1:
        return np.ones_like(logs)
    joint = logs + np.log(np.maximum(weights, np.finfo(np.float64).tiny))[:, None]
    joint -= joint.max(axis=0, keepdims=True)
    numerator = np.exp(joint)
    return numerator / numerator.sum(axis=0, keepdims=True)


def updated_mixing(resp: np.ndarray, floor: float) -> np.ndarray:
    """pi_s = max(mean_i r[s, i], floor), renormalised to sum to one (uniform
    for a client without samples)."""
    values = np.asarray(resp, dtype=np.float64)
    if values.shape[1] == 0:
        return uniform_mixing(values.shape[0])
    floored = np.maximum(values.mean(axis=1), floor)
    return floored / floored.sum()


def membership(log_likelihoods: np.ndarray, start: np.ndarray, floor: float, tolerance: float = 1.0e-8, max_iterations: int = 1000) -> np.ndarray:
    """The client's mixing weights pi_k with the components held fixed: EM on pi
    alone (pi <- updated_mixing(responsibilities(log_likelihoods, pi), floor)),
    iterated from `start` until no weight moves by more than `tolerance`. Without
    the floor this is the pi that maximises the client's likelihood of the
    ensemble, sum_i log sum_s pi_s p_s(y_i | x_i). Each iteration cannot lower
    that likelihood; starting from the stored pi keeps the choice between
    components that explain the data equally well where it was."""
    logs = np.asarray(log_likelihoods, dtype=np.float64)
    mixing = np.asarray(start, dtype=np.float64)
    if logs.shape[0] == 1:
        return np.ones(1)
    for _ in range(max_iterations):
        updated = updated_mixing(responsibilities(logs, mixing), floor)
        done = np.max(np.abs(updated - mixing)) <= tolerance
        mixing = updated
        if done:
            break
    return mixing


def components_to_train(mass: np.ndarray, num_samples: int, min_share: float) -> list[int]:
    """The components whose share m_s / N of the client's data is at least `min_share`."""
    if num_samples == 0:
        return []
    return [s for s, m in enumerate(np.asarray(mass, dtype=np.float64)) if m / num_samples >= min_share]


def sample_weights(resp: np.ndarray) -> np.ndarray | None:
    """One component's per-sample loss weights on a client: its responsibilities
    scaled to mean one, so the batch loss mean_i w_i CE_i estimates
    sum_i r_i CE_i / sum_i r_i (the client's M-step objective at full step size;
    the server's soft-count average restores each client's share). Weights are at
    most 1 / share, so `min_share` bounds them. None when every weight is 1 (one
    component): training then runs unweighted, the same bits as FedAvg."""
    values = np.asarray(resp, dtype=np.float64)
    weights = (values / values.mean()).astype(np.float32)
    return None if np.all(weights == 1.0) else weights


def mix_outputs(outputs: Sequence[Any], weights: Sequence[float]) -> Any:
    """sum_s weights[s] * outputs[s]: the output-space ensemble of class
    probabilities (numpy arrays or torch tensors alike)."""
    if len(outputs) != len(weights) or not outputs:
        raise ValueError(f"need one weight per output, got {len(outputs)} outputs and {len(weights)} weights")
    mixed = outputs[0] * float(weights[0])
    for output, weight in zip(outputs[1:], weights[1:]):
        mixed = mixed + output * float(weight)
    return mixed


def aggregate_components(components: list[ModelParams], uploads: list[Upload]) -> tuple[list[ModelParams], list[float]]:
    """theta_s = sum_k m_{k,s} theta_{k,s} / sum_k m_{k,s} over the uploads that
    carry component s (in the given order); a component nobody trained is
    returned unchanged. Also returns each component's total soft count."""
    updated: list[ModelParams] = []
    masses: list[float] = []
    for s, component in enumerate(components):
        name = cluster_object_name(s)
        contributors = [u for u in uploads if name in u.models]
        weights = [float(u.values["mass"][s]) for u in contributors]
        masses.append(float(sum(weights)))
        if not contributors or sum(weights) <= 0.0:
            updated.append(component)
            continue
        updated.append(weighted_average_model(contributors, lambda u: u.models[name], weights))
    return updated, masses


# ---- the algorithm ----


@dataclass
class FedCEState:
    components: list[ModelParams]
    server_moments: ServerMoments = field(default_factory=dict)  # protocol.server_optimizer's state, per component
    clip: ClipState | None = None  # under privacy: the clip the clients use this round


# Upload.values key under privacy: the client's share m_{k,s} / n_k of each component it trained
# (0 for the others), the weights of its updates in the release
SHARES = "shares"


@dataclass(frozen=True)
class FedCEClient:
    """The client's mixing weights pi_k after its last training round (None before it)."""

    mixing: np.ndarray | None = None


class FedCE(AlgorithmDefaults):
    name = "fedce"

    def __init__(self, params: FedCEParams, run: RunInfo) -> None:
        self.params = params
        self.seed = run.seed
        self.server_optimizer = run.server_optimizer
        self.privacy: ResolvedPrivacy | None = run.privacy
        self.count = params.clusters
        # component 0 is the shared initial model; the others need their own seeds
        self.independent_inits = params.clusters - 1
        self.names = cluster_object_names(params.clusters)

    # ---- server ----
    def init_server(self, initial: ModelParams, independent: list[ModelParams], num_clients: int) -> FedCEState:
        if len(independent) != self.count - 1:
            raise ValueError(f"FedCE needs {self.count - 1} independent initialisations, got {len(independent)}")
        return FedCEState(
            components=[copy_model(initial)] + [copy_model(model) for model in independent],
            clip=None if self.privacy is None else ClipState(self.privacy.clip),
        )

    def broadcast(self, state: FedCEState, round_index: int) -> dict[str, Any]:
        return {name: model for name, model in zip(self.names, state.components)}

    def training_task(self, state: FedCEState, round_index: int, client_id: int) -> ClientTask:
        if state.clip is not None:
            return ClientTask(models=self.names, payload={"clip": state.clip.clip})
        return ClientTask(models=self.names)

    def aggregate(self, state: FedCEState, round_index: int, uploads: list[Upload]) -> RoundNotes:
        if self.privacy is not None and state.clip is not None:
            return self._aggregate_private(self.privacy, state, state.clip, round_index, uploads)
        ordered = sorted(uploads, key=lambda u: u.client_id)
        averaged, masses = aggregate_components(state.components, ordered)
        trained = {s for s, mass in enumerate(masses) if mass > 0.0}  # aggregate_components leaves the others unchanged
        state.components = server_step_clusters(self.server_optimizer, state.server_moments, state.components, averaged, trained)
        events = []
        if round_index == 1:
            events += [
                f"fedce: soft EM mixture of {self.count} components; component 0 starts from the shared initial model, "
                f"the others from independently seeded models (symmetry breaking)",
                f"fedce: personalised model = {self.params.ensemble}-space ensemble weighted by pi_k; "
                f"components with a share under {self.params.min_share} of a client's data are not trained by it",
            ]
        trainers = [sum(1 for u in ordered if name in u.models) for name in self.names]
        events.append(
            f"fedce round {round_index}: soft counts per component {[round(m, 1) for m in masses]}, "
            f"trained by {trainers} clients (components with 0 unchanged)"
        )
        return RoundNotes(events=tuple(events))

    def _aggregate_private(self, privacy: ResolvedPrivacy, state: FedCEState, clip: ClipState, round_index: int, uploads: list[Upload]) -> RoundNotes:
        """Every component's noised share-weighted sum of the clipped updates with its noised
        share-weighted count, one release; a component whose noised count is below
        privacy.min_group_size keeps its weights. Only the noised counts are logged."""
        members = [(np.asarray(upload.values[SHARES], dtype=np.float64), upload) for upload in uploads]
        state.components, release = stepped_by_soft_release(
            privacy, clip, members, state.components, self.server_optimizer, state.server_moments, uploads, self.seed, round_index
        )
        events: list[str] = []
        if round_index == 1:
            events.append(
                f"fedce under privacy: {self.count} components (component 0 from the shared initial model, the others "
                "independently seeded); component s moves by the noised share-weighted mean of the clipped updates of the "
                "clients that trained it; the mixing weights stay on the clients"
            )
        counts = ", ".join(f"{count:.1f}" for count in release.counts)
        events.append(f"fedce round {round_index}: noised component weights [{counts}]")
        return RoundNotes(releases=(privacy.release(),), events=tuple(events))

    def evaluation_task(self, state: FedCEState, round_index: int, client_id: int, final: bool) -> ClientTask:
        return ClientTask(models=self.names)

    # ---- client ----
    def init_client(self, client_id: int, initial: ModelParams) -> FedCEClient:
        return FedCEClient()

    def e_step(self, ctx: ClientContext, state: FedCEClient, models: list[ModelParams]) -> tuple[np.ndarray, np.ndarray]:
        """The client's membership pi_k (EM on pi with the current components, from the
        stored pi_k) and the tempered responsibilities (S, N) of its training samples
        under that pi_k: the training weights."""
        if self.count == 1:  # nothing to infer; skip the forward pass
            return np.ones((1, ctx.num_train)), np.ones(1)
        stored = state.mixing if state.mixing is not None else uniform_mixing(self.count)
        log_likelihoods = -np.stack([ctx.per_sample_losses(model) for model in models]).astype(np.float64)
        mixing = membership(log_likelihoods, stored, self.params.smoothing)
        return responsibilities(log_likelihoods / self.params.temperature, mixing), mixing

    def local_update(self, ctx: ClientContext, state: FedCEClient, task: ClientTask, objects: Mapping[str, Any]) -> tuple[Upload, FedCEClient]:
        import torch  # client side only: the server never imports torch

        models = models_from_objects(objects, self.count)
        resp, mixing = self.e_step(ctx, state, models)
        mass = resp.sum(axis=1)
        num_samples = ctx.num_train
        trained: dict[str, ModelParams] = {}
        loss, steps = 0.0, 0
        for s in components_to_train(mass, num_samples, self.params.min_share):
            ctx.load(models[s])
            weights = sample_weights(resp[s])
            stats = ctx.train(sample_weights=None if weights is None else torch.as_tensor(weights, device=ctx.train_data()[1].device))
            trained[self.names[s]] = ctx.snapshot()
            loss += stats.mean_loss * float(mass[s]) / num_samples  # the expected loss under r
            steps += stats.steps
        if "clip" in task.payload:
            upload = self._private_upload(ctx.client_id, models, trained, mass, num_samples, loss, steps, float(task.payload["clip"]))
            return upload, FedCEClient(mixing=mixing)
        upload = Upload(
            client_id=ctx.client_id,
            num_samples=num_samples,
            train_loss=loss,
            steps=steps,
            models=trained,
            values={"mass": mass, "mixing": mixing},
        )
        return upload, FedCEClient(mixing=mixing)

    def _private_upload(
        self,
        client_id: int,
        models: list[ModelParams],
        trained: Mapping[str, ModelParams],
        mass: np.ndarray,
        num_samples: int,
        loss: float,
        steps: int,
        clip: float,
    ) -> Upload:
        """Under privacy: each trained component's clipped update against the component the
        client downloaded, with the client's share of each (0 where it trained none); the
        trained models, pi_k and the soft counts stay on the client."""
        updates: dict[str, ModelParams] = {}
        shares = np.zeros(self.count)
        largest = 0.0
        for s, name in enumerate(self.names):
            if name not in trained:
                continue
            update, norm = clipped_update(models[s], trained[name], clip, with_head=True)
            updates[group_update_key(s)] = update
            shares[s] = float(mass[s]) / num_samples
            largest = max(largest, norm)
        return Upload(
            client_id=client_id,
            num_samples=num_samples,
            train_loss=loss,
            steps=steps,
            models=updates,
            values={WITHIN_CLIP: int(largest <= clip), SHARES: shares},
        )

    def evaluate(self, ctx: ClientContext, state: FedCEClient, task: ClientTask, objects: Mapping[str, Any], final: bool) -> EvalResult:
        from hdcfl_ray.training.scores import stats_from_probabilities  # imports torch: client side only

        models = models_from_objects(objects, self.count)
        _, mixing = self.e_step(ctx, state, models)
        if self.count == 1:  # an ensemble of one model is that model
            personalized = ctx.score(models[0])
        elif self.params.ensemble == "output":
            probabilities = mix_outputs([ctx.probabilities(model) for model in models], mixing)
            personalized = stats_from_probabilities(probabilities, ctx.test_data()[1], own_classes=ctx.own_classes())
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

    # ---- newcomers (partition.newcomers): FedCE's own evaluation from a uniform membership ----
    def newcomer_task(self, state: FedCEState, round_index: int, client_id: int, probe: Mapping[str, Any] | None) -> ClientTask:
        return ClientTask(models=self.names)

    def evaluate_newcomer(self, ctx: ClientContext, state: FedCEClient, task: ClientTask, objects: Mapping[str, Any], epochs: int) -> EvalResult:
        return self.evaluate(ctx, state, task, objects, final=False)


METHOD = MethodSpec(
    name="fedce",
    summary="FedCE: a soft EM mixture of S component models per client, ensembled at test time",
    params=FedCEParams,
    build=lambda params, run: FedCE(params, run),
    applies_server_optimizer=True,
    extra_models="clusters",
    # as docs/calibration.md chose them by hand: S first (at T = 4), then T at the chosen S
    auto_knobs=(AutoKnob("clusters", (2, 4), counts_models=True, beyond=doubled_count), AutoKnob("temperature", (1.0, 2.0, 4.0), placeholder=4.0)),
    newcomer_rule="its membership by EM on its training data from uniform weights, and that ensemble of the components (FedCE's evaluation), untrained",
    privacy=PrivacyRule(
        sends="the update of each component the client trained against the component it downloaded (encoder and head), "
        "each clipped, with the client's share of each (summing to at most one): every component's share-weighted sum "
        "with its weighted count, one noised release a round",
        kept_on_client="the mixing weights pi_k, the soft counts and n_k (a client counts by its shares, not its samples); "
        "the server uses the shares only inside the noised sums",
    ),
)
