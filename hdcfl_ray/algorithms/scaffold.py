"""SCAFFOLD (Karimireddy et al., ICML 2020), option II: FedAvg whose local steps are
corrected by control variates, so that each client's drift towards its own optimum is
cancelled (docs/baselines.md, SCAFFOLD).

- The server keeps the global model x and the server control variate c; each client k
  keeps its own control variate c_k (its client state, zero until it first trains),
  which the runtime stores with the client's state: checkpoints and host restarts keep it.
- Client: from the downloaded x and c, every local step's gradient is g + (c - c_k),
  as the loss term <c - c_k, w> (a `LinearTerm`, so the batched runtime trains it);
  after tau_k steps (`TrainStats.steps`), reaching y_k,
  c_k+ = c_k - c + (x - y_k) / (a_k lr), with lr the client optimiser's learning rate
  and a_k the momentum-aware step count (`hdcfl_ray.maths.local_steps`): tau_k for plain
  SGD (the paper's K), and for SGD with momentum rho the distance tau_k momentum steps
  move for a unit gradient. The client sends y_k (as FedAvg does: Delta y = y_k - x is
  formed on the server) and Delta c = c_k+ - c_k.
- Server: x += eta_g (mean_k y_k - x) with the sample-weighted mean of FedAvg
  (eta_g = `server_lr`; at 1 the new model is FedAvg's average itself, bit for bit), then
  protocol.server_optimizer's step as for every sharing method;
  c += (1/N) sum_k Delta c_k = (|S|/N) mean_k Delta c_k over the round's |S| clients (N
  clients in all, the paper's plain mean; newcomers, which never train, are not counted),
  so c stays the mean of all clients' c_k.
- Which entries: the whole model, encoder and head. BatchNorm running statistics take no
  gradient and get no control variate (their entries stay zero); they are averaged as
  FedAvg averages them: at eta_g != 1 the client uploads them as x + (y_k - x) / eta_g,
  so the server's step lands on their sample-weighted mean.
- Traffic: twice FedAvg's, both ways: down x and c, up y_k and Delta c (each a
  model-sized vector; control variates keep the model's shape). Evaluation downloads x only.
- SGD only (the correction and a_k assume it): protocol.optimizer.name: adam is refused
  (exit 2). Synchronous only. Scored with the global model, like FedAvg. The logged
  training loss is the local objective CE + <c - c_k, w - x>.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from pydantic import Field

from hdcfl_ray.algorithms.fedavg import GLOBAL_MODEL_RULE, FedAvg, GlobalModelState
from hdcfl_ray.algorithms.scaffold_control import (
    correction_at,
    difference,
    is_zero,
    linear_correction,
    parameter_masks,
    statistics_prescaled,
    updated_control,
    zeros_like,
)
from hdcfl_ray.contract import ClientContext, ClientTask, MethodSpec, ModelParams, RoundNotes, Section, ServerOptimizerConfig, Upload
from hdcfl_ray.maths.aggregate import weighted_average_model
from hdcfl_ray.maths.local_steps import momentum_step_count, sgd_only
from hdcfl_ray.maths.server_optimizer import server_step

CONTROL = "control"  # the server control variate's broadcast name, and Delta c's in an upload


class ScaffoldParams(Section):
    """The server's global step size."""

    server_lr: float = Field(
        1.0, gt=0.0, description="eta_g of x += eta_g mean(y_k - x); 1 = FedAvg's average as the new model (the paper's default)"
    )


@dataclass
class ScaffoldServer(GlobalModelState):
    """FedAvg's global model and server moments, the server control variate c and N."""

    control: ModelParams | None = None
    num_clients: int = 0


@dataclass
class ScaffoldClient:
    """A client's control variate c_k; None until it first trains (zero)."""

    control: ModelParams | None = None


def stepped(current: ModelParams, mean: ModelParams, rate: float) -> ModelParams:
    """current + rate (mean - current), float64 arithmetic, float32; `mean` itself at rate 1."""
    if rate == 1.0:
        return mean

    def part(x: np.ndarray | None, m: np.ndarray | None) -> np.ndarray | None:
        if x is None or m is None:
            return m
        x64 = np.asarray(x, np.float64)
        return (x64 + rate * (np.asarray(m, np.float64) - x64)).astype(np.float32)

    encoder = part(current.encoder, mean.encoder)
    assert encoder is not None
    return ModelParams(encoder=encoder, head=part(current.head, mean.head))


class Scaffold(FedAvg):
    name = "scaffold"

    def __init__(self, params: ScaffoldParams, server_optimizer: ServerOptimizerConfig = ServerOptimizerConfig(), newcomers: int = 0) -> None:
        super().__init__(server_optimizer)
        self.params = params
        self.newcomers = newcomers  # clients that never train (partition.newcomers): no c_k, not in N

    def init_server(self, initial: ModelParams, independent: list[ModelParams], num_clients: int) -> ScaffoldServer:
        return ScaffoldServer(model=initial, control=zeros_like(initial), num_clients=num_clients - self.newcomers)

    def init_client(self, client_id: int, initial: ModelParams) -> ScaffoldClient:  # type: ignore[override]
        return ScaffoldClient()

    def broadcast(self, state: ScaffoldServer, round_index: int) -> dict[str, Any]:  # type: ignore[override]
        return {"global": state.model, CONTROL: state.control}

    def training_task(self, state: ScaffoldServer, round_index: int, client_id: int) -> ClientTask:  # type: ignore[override]
        return ClientTask(models=("global", CONTROL))

    def aggregate(self, state: ScaffoldServer, round_index: int, uploads: list[Upload]) -> RoundNotes:  # type: ignore[override]
        ordered = sorted(uploads, key=lambda upload: upload.client_id)
        if not ordered:
            return RoundNotes()
        averaged = weighted_average_model(ordered, lambda u: u.models["model"], [u.num_samples for u in ordered])
        target = stepped(state.model, averaged, self.params.server_lr)
        state.model = server_step(self.server_optimizer, state.server_moments, "global", state.model, target)
        mean_delta = weighted_average_model(ordered, lambda u: u.models[CONTROL], [1.0] * len(ordered))
        assert state.control is not None
        state.control = _add_scaled(state.control, mean_delta, len(ordered) / state.num_clients)
        return RoundNotes(events=_diverging(round_index, ordered))

    def local_update(self, ctx: ClientContext, state: ScaffoldClient, task: ClientTask, objects: Mapping[str, Any]) -> tuple[Upload, ScaffoldClient]:  # type: ignore[override]
        start: ModelParams = objects["global"]
        server_control: ModelParams = objects[CONTROL]
        own = state.control if state.control is not None else zeros_like(start)
        correction = difference(server_control, own)
        regulariser = None if is_zero(correction) else linear_correction(ctx, correction)
        ctx.load(start)
        stats = ctx.train(regulariser=regulariser)
        trained = ctx.snapshot()
        masks = parameter_masks(ctx)
        optimizer = ctx.protocol.optimizer
        scale = momentum_step_count(stats.steps, optimizer.momentum) * optimizer.lr
        new_own = updated_control(own, server_control, start, trained, masks, scale)
        # the objective minimised, measured from the downloaded model: CE + <c - c_k, w - x>
        loss = stats.mean_loss if regulariser is None else stats.mean_loss - correction_at(correction, start)
        upload = Upload(
            ctx.client_id,
            stats.num_samples,
            loss,
            stats.steps,
            models={"model": statistics_prescaled(start, trained, masks, self.params.server_lr), CONTROL: difference(new_own, own)},
        )
        return upload, ScaffoldClient(control=new_own)


def _diverging(round_index: int, uploads: list[Upload]) -> tuple[str, ...]:
    """An event for a round where some client's local objective CE + <c - c_k, w - x> fell
    below zero: the correction outweighs the loss, the start of a divergence."""
    negative = [u.client_id for u in uploads if u.train_loss < 0.0]
    if not negative:
        return ()
    return (
        f"SCAFFOLD round {round_index}: the local objective (cross-entropy plus the correction's linear term) is below zero "
        f"at {len(negative)} of {len(uploads)} clients: the control variates outweigh the loss and the model is diverging; "
        "shorten the local steps' reach (a smaller protocol.optimizer.lr or momentum, fewer protocol.local_epochs) "
        "or set algorithm.scaffold.server_lr below 1 (docs/baselines.md, SCAFFOLD)",
    )


def _add_scaled(a: ModelParams, b: ModelParams, scale: float) -> ModelParams:
    """a + scale b: float64 arithmetic, float32 (c + |S|/N mean Delta c)."""

    def part(x: np.ndarray | None, y: np.ndarray | None) -> np.ndarray | None:
        if x is None or y is None:
            return x
        return (np.asarray(x, np.float64) + scale * np.asarray(y, np.float64)).astype(np.float32)

    encoder = part(a.encoder, b.encoder)
    assert encoder is not None
    return ModelParams(encoder=encoder, head=part(a.head, b.head))


METHOD = MethodSpec(
    name="scaffold",
    summary="SCAFFOLD: FedAvg with control variates correcting every local step for the client's drift",
    params=ScaffoldParams,
    build=lambda params, run: Scaffold(params, run.server_optimizer, newcomers=len(run.newcomers)),
    check=lambda _params, run: sgd_only("scaffold", run.client_optimizer.name),
    applies_server_optimizer=True,
    newcomer_rule=GLOBAL_MODEL_RULE,
    no_privacy_reason="each client also sends its control-variate change, a second model-sized stream with no clip and noise of its own yet",
)
