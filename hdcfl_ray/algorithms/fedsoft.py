"""FedSoft: S soft cluster centres, one persistent personal model w_k per client,
and a proximal pull of every w_k toward all centres weighted by the client's
importance weights u_k (spec/baselines.md section 5).

Choices made here, each documented where it acts:
- Full models: centres and w_k are encoder plus head ([REC] section 0); the
  client's private head of other methods is unused. Centres start from S
  independently seeded models (logged at round 1); every w_k starts from the
  shared initial model.
- Importance estimation runs for every client at round 1 (so u exists before the
  first local update) and then whenever t mod tau == 0. u_k is renormalised to
  sum to one after smoothing (see `importance.importance_weights`).
- Selection. "sampled" (default): the runtime's uniform per-round sample
  trains, so FedSoft spends the same local budget as every other method, and
  c_s = sum_k v_{s,k} w_k / sum_k v_{s,k} over those uploads. "select": each
  centre draws K_sel distinct clients with probabilities v_{s,.} from the online
  clients, the union trains (its size is logged; the budget can exceed the
  others') and c_s is the plain mean of its draws. "all_clients": every online
  client trains every round and c_s = sum_k v_{s,k} w_k (the reference's
  importance-weighted aggregation; about 1/participation times the budget, so
  reports label it fedsoft-all).
- lambda defaults to 0.01, re-derived for momentum SGD: one step pulls w toward
  the anchor by lr * lambda / (1 - momentum) of the distance, so lambda = 0.01
  closes about 5% of it per 10 steps at lr 0.05, momentum 0.9; the reference's
  0.1 was set for Adam at lr 1e-4, whose steps are bounded by the learning rate
  (docs/baselines.md shows the derivation and the calibration runs).
- The proximal term covers model parameters only; BatchNorm running statistics
  are not pulled, but they are averaged into the centres with everything else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping

import numpy as np
from pydantic import Field

from hdcfl_ray import seeding
from hdcfl_ray.algorithms.aggregate import weighted_average_model
from hdcfl_ray.algorithms.defaults import AlgorithmDefaults
from hdcfl_ray.algorithms.fedsoft_importance import argmin_counts, importance_weights, select_per_centre, server_weights
from hdcfl_ray.algorithms.proximal import proximal_regulariser
from hdcfl_ray.contract import ClientContext, ClientTask, EvalResult, MethodSpec, ModelParams, RoundNotes, RunInfo, Section, Upload


class FedSoftParams(Section):
    """S soft cluster centres and a proximal pull of each personal model (spec/baselines.md, FedSoft)."""

    centers: int = Field(3, ge=1, description="S cluster centres")
    # re-derived for momentum SGD (docs/baselines.md, FedSoft): 0.1 from Adam at lr 1e-4
    # ties every model to its randomly initialised centres under SGD at lr 0.05
    proximal: float = Field(0.01, ge=0.0, description="lambda of the proximal pull towards the centres")
    importance_every: int = Field(2, ge=1, description="tau: rounds between importance estimates")
    smoothing: float = Field(1.0e-4, ge=0.0, description="sigma: floor on the importance counts")
    selection: int = Field(20, ge=1, description="K_sel clients per centre (selection_mode: select)")
    # "sampled": the runtime's per-round sample trains (every method's budget) and each centre is the
    # importance-weighted average of those uploads; "select": each centre draws K_sel clients with
    # probabilities v_s (the union trains); "all_clients": every online client trains every round
    # (about 1/participation times the budget; reported as its own method, fedsoft-all)
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


@dataclass
class FedSoftClient:
    """A client's persistent personal model w_k."""

    model: ModelParams


class FedSoft(AlgorithmDefaults):
    name = "fedsoft"

    def __init__(self, params: FedSoftParams, run: RunInfo) -> None:
        self.params = params
        self.seed = run.seed
        self.independent_inits = params.centers

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
        return FedSoftState(
            centres=[ModelParams(np.array(m.encoder, dtype=np.float32), np.array(m.head, dtype=np.float32)) for m in independent],
            num_clients=num_clients,
            weighted=weighted,
            importance=importance,
            num_samples=num_samples,
            weights=server_weights(importance, num_samples),
        )

    def startup_events(self, state: FedSoftState) -> tuple[str, ...]:
        k, k_sel = state.num_clients, self.params.selection
        events = [
            f"fedsoft: {self.params.centers} centres start from independently seeded models (symmetry breaking); "
            "client models start from the shared initial model"
        ]
        mode = self.params.selection_mode
        if mode == "sampled":
            events.append("fedsoft: selection_mode=sampled: the runtime's per-round sample trains, c_s = sum_k v_sk w_k over its uploads")
        elif mode == "all_clients":
            events.append("fedsoft: selection_mode=all_clients: every online client trains every round, c_s = sum_k v_sk w_k")
        else:
            events.append(
                f"fedsoft: per-centre selection of {min(k_sel, k)} of {k} clients drawn with probabilities v_s "
                "(the uniform per-round sample is not used)"
            )
            if k_sel >= k:
                events.append(f"fedsoft: warning: selection {k_sel} >= {k} clients: every centre selects all clients")
        return tuple(events)

    def probe_task(self, state: FedSoftState, round_index: int, client_id: int) -> ClientTask | None:
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
        return ClientTask(models=self.centre_names(), payload={"importance": state.importance[client_id].copy()})

    def aggregate(self, state: FedSoftState, round_index: int, uploads: list[Upload]) -> RoundNotes:
        by_client = {upload.client_id: upload for upload in uploads}
        events = []
        for s in range(self.params.centers):
            if state.selections is not None:
                members = [int(k) for k in state.selections[s] if int(k) in by_client]
                weights = [1.0] * len(members)  # importance already entered through the draw
                events.append(f"fedsoft: centre {s} selected {state.selections[s].tolist()}, averaged {len(members)}")
            else:
                members = [k for k in sorted(by_client) if state.weights[s, k] > 0]
                weights = [float(state.weights[s, k]) for k in members]
            if not members:
                events.append(f"fedsoft: centre {s} has no contributing upload this round; unchanged")
                continue
            state.centres[s] = weighted_average_model(members, lambda k: by_client[k].models["model"], weights)
        return RoundNotes(events=tuple(events))

    def evaluation_task(self, state: FedSoftState, round_index: int, client_id: int, final: bool) -> ClientTask:
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

    def evaluate(self, ctx: ClientContext, state: FedSoftClient, task: ClientTask, objects: Mapping[str, Any], final: bool) -> EvalResult:
        importance = np.asarray(task.payload["importance"], dtype=np.float64)
        return EvalResult(
            references={"personalized": ctx.score(state.model)},
            headline="personalized",
            group=int(np.argmax(importance)),
            memberships=tuple(float(u) for u in importance),
        )


METHOD = MethodSpec(
    name="fedsoft",
    summary="FedSoft: S soft cluster centres and a proximal pull of each personal model towards them",
    params=FedSoftParams,
    build=lambda params, run: FedSoft(params, run),
)
