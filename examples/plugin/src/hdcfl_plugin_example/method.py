"""FedAvgM: FedAvg with server momentum (Hsu, Qi & Brown, 2019).

The server treats the clients' averaged change as a pseudo-gradient and applies it
with momentum: v <- beta * v + (avg - w); w <- w + server_lr * v. With beta = 0
and server_lr = 1 it is FedAvg."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import Field

from hdcfl_ray.maths.aggregate import weighted_average_model
from hdcfl_ray.algorithms.fedavg import FedAvg
from hdcfl_ray.contract import MethodSpec, ModelParams, RoundNotes, Section, Upload


class FedAvgMParams(Section):
    """The scenario's algorithm.fedavgm section."""

    server_lr: float = Field(1.0, gt=0.0, description="server step on the momentum buffer")
    momentum: float = Field(0.9, ge=0.0, lt=1.0, description="beta: the server momentum")


@dataclass
class MomentumState:
    model: ModelParams
    velocity: ModelParams | None = None


class FedAvgM(FedAvg):
    name = "fedavgm"

    def __init__(self, params: FedAvgMParams) -> None:
        self.params = params

    def init_server(self, initial: ModelParams, independent: list[ModelParams], num_clients: int) -> Any:
        return MomentumState(model=initial)

    def aggregate(self, state: Any, round_index: int, uploads: list[Upload]) -> RoundNotes:
        if not uploads:
            return RoundNotes()
        ordered = sorted(uploads, key=lambda upload: upload.client_id)
        average = weighted_average_model(ordered, lambda u: u.models["model"], [u.num_samples for u in ordered])
        beta, step = self.params.momentum, self.params.server_lr
        delta = {part: getattr(average, part) - getattr(state.model, part) for part in ("encoder", "head")}
        if state.velocity is None:
            velocity = delta
        else:
            velocity = {part: beta * getattr(state.velocity, part) + delta[part] for part in delta}
        state.velocity = ModelParams(**{part: np.asarray(value, np.float32) for part, value in velocity.items()})
        state.model = ModelParams(
            **{part: np.asarray(getattr(state.model, part) + step * velocity[part], np.float32) for part in velocity}
        )
        return RoundNotes()


METHOD = MethodSpec(
    name="fedavgm",
    summary="FedAvgM: FedAvg with server momentum (Hsu et al., 2019); an example plugin",
    params=FedAvgMParams,
    build=lambda params, run: FedAvgM(params),
)
