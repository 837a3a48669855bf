"""FedNova (Wang et al., NeurIPS 2020): FedAvg whose clients' updates are normalised by
how far their local SGD moved, so that clients taking more local steps do not pull
the global model towards their own objective (docs/baselines.md, FedNova).

- Client k trains the downloaded x exactly as FedAvg's clients do (the protocol's
  optimiser, epochs and batch size) for tau_k steps (`TrainStats.steps`), reaching y_k,
  and sends d_k = (x - y_k) / a_k with the momentum-aware normaliser
  a_k = sum_{j < tau_k} (1 - rho^(j+1)) / (1 - rho) (rho = protocol.optimizer.momentum;
  rho = 0: a_k = tau_k; `hdcfl_ray.maths.local_steps`) and a_k itself.
- Server: with p_k = n_k / sum n (sample weights, as FedAvg), tau_eff = sum_k p_k a_k and
  the new model is x - tau_eff * sum_k p_k d_k (float64, stored float32): NIID-Bench's
  FedNova rule. The server learning rate is protocol.server_optimizer's (its default,
  sgd at lr 1, takes this model as it is; sgd at lr s moves x by s times the step),
  applied through `server_step` as every sharing method does.
- The whole flat vector, BatchNorm statistics included, takes the normalised step (as in
  NIID-Bench, which normalises every state entry); with equal a_k it is FedAvg's average.
- With equal a_k (equal sample counts, so equal steps) the step is x - a * sum p_k (x - y_k) / a,
  FedAvg's average up to float32 rounding (tested).
- SGD only: a_k counts SGD steps; protocol.optimizer.name: adam is refused (exit 2).
  Scored with the global model, like FedAvg. Synchronous only.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from hdcfl_ray.algorithms.fedavg import GLOBAL_MODEL_RULE, FedAvg, GlobalModelState
from hdcfl_ray.contract import ClientContext, ClientTask, MethodSpec, ModelParams, NoParams, RoundNotes, Upload
from hdcfl_ray.maths.aggregate import weighted_average_model
from hdcfl_ray.maths.local_steps import momentum_step_count, sgd_only
from hdcfl_ray.maths.server_optimizer import server_step

# the upload's keys: the normalised update d_k (a model-sized vector) and a_k
DIRECTION = "direction"
NORMALISER = "normaliser"


def normalised_difference(start: ModelParams, trained: ModelParams, normaliser: float) -> ModelParams:
    """(start - trained) / normaliser, float32 (zero when no step was taken)."""

    def part(x: np.ndarray | None, y: np.ndarray | None) -> np.ndarray | None:
        if x is None or y is None:
            return None
        if normaliser == 0.0:
            return np.zeros_like(x, dtype=np.float32)
        return ((np.asarray(x, np.float64) - np.asarray(y, np.float64)) / normaliser).astype(np.float32)

    encoder = part(start.encoder, trained.encoder)
    assert encoder is not None
    return ModelParams(encoder=encoder, head=part(start.head, trained.head))


def normalised_step(current: ModelParams, direction: ModelParams, tau_eff: float) -> ModelParams:
    """current - tau_eff * direction, computed in float64, float32."""

    def part(x: np.ndarray | None, d: np.ndarray | None) -> np.ndarray | None:
        if x is None or d is None:
            return d
        return (np.asarray(x, np.float64) - tau_eff * np.asarray(d, np.float64)).astype(np.float32)

    encoder = part(current.encoder, direction.encoder)
    assert encoder is not None
    return ModelParams(encoder=encoder, head=part(current.head, direction.head))


class FedNova(FedAvg):
    name = "fednova"

    def aggregate(self, state: GlobalModelState, round_index: int, uploads: list[Upload]) -> RoundNotes:
        ordered = sorted((u for u in uploads if u.num_samples > 0), key=lambda upload: upload.client_id)
        if ordered:
            weights = np.asarray([u.num_samples for u in ordered], dtype=np.float64)
            shares = weights / weights.sum()
            tau_eff = float(sum(share * float(u.values[NORMALISER]) for share, u in zip(shares, ordered)))
            direction = weighted_average_model(ordered, lambda u: u.models[DIRECTION], [u.num_samples for u in ordered])
            stepped = normalised_step(state.model, direction, tau_eff)
            state.model = server_step(self.server_optimizer, state.server_moments, "global", state.model, stepped)
        return RoundNotes()

    def local_update(self, ctx: ClientContext, state: None, task: ClientTask, objects: Mapping[str, Any]) -> tuple[Upload, None]:
        start: ModelParams = objects["global"]
        ctx.load(start)
        stats = ctx.train()
        normaliser = momentum_step_count(stats.steps, ctx.protocol.optimizer.momentum)
        direction = normalised_difference(start, ctx.snapshot(), normaliser)
        upload = Upload(
            ctx.client_id, stats.num_samples, stats.mean_loss, stats.steps, models={DIRECTION: direction}, values={NORMALISER: normaliser}
        )
        return upload, None


METHOD = MethodSpec(
    name="fednova",
    summary="FedNova: FedAvg with each client's update normalised by its momentum-aware local step count",
    params=NoParams,
    build=lambda _params, run: FedNova(run.server_optimizer),
    check=lambda _params, run: sgd_only("fednova", run.client_optimizer.name),
    applies_server_optimizer=True,
    newcomer_rule=GLOBAL_MODEL_RULE,
    no_privacy_reason="its server step averages the clients' local step counts, which reveal their data sizes, and no noised release of them is written",
)
