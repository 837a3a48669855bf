"""FedProx: FedAvg (one global model, encoder and head, sample-weighted averaging)
whose clients minimise CE + (mu/2) ||w - w_global||^2, w_global being the model
they downloaded this round.

- The anchor is the broadcast model itself (one anchor, weight 1), through the
  shared `proximal.proximal_regulariser`; BatchNorm statistics are not pulled but
  are averaged with everything else, as in FedAvg.
- mu = 0 switches the term off: FedProx is then FedAvg bit for bit (tested).
- mu is a data-dependent knob: the paper tunes it per setting over
  {0.001, 0.01, 0.1, 1}, and so does this project, with `hdcfl-ray calibrate` on
  held-out validation data (docs/calibration.md). The default 0.01 sits at the low
  end of that grid (its second value) and is not derived from this project's
  optimiser: the stationary point of the local problem CE + (mu/2) ||w - w_global||^2
  does not depend on the learning rate or the momentum, which scale the data term's
  gradient and the pull alike.
- Scored with the global model, like FedAvg. Synchronous only.
- Under privacy (docs/privacy.md) the client keeps its proximal pull and sends FedAvg's
  clipped update of the model it trained; the server steps with their noised mean.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Mapping

import numpy as np
from pydantic import Field

from hdcfl_ray.algorithms.fedavg import GLOBAL_MODEL_RULE, FedAvg
from hdcfl_ray.algorithms.private_updates import clipped_update, private_upload
from hdcfl_ray.algorithms.proximal import proximal_regulariser
from hdcfl_ray.contract import (
    AutoKnob,
    ClientContext,
    ClientTask,
    MethodSpec,
    PrivacyRule,
    ResolvedPrivacy,
    Section,
    ServerOptimizerConfig,
    Upload,
    tenfold,
)


class FedProxParams(Section):
    """The proximal pull of every local update towards the downloaded global model."""

    # the paper tunes mu per setting over {0.001, 0.01, 0.1, 1}: `auto` chooses it on that grid, per
    # setting, on held-out validation data
    mu: Annotated[float, Field(ge=0.0)] | Literal["auto"] = Field(
        "auto",
        description="mu of (mu/2)||w - w_global||^2, 0 = FedAvg; data-dependent: auto = chosen before the run on "
        "held-out training images among 0.001, 0.01, 0.1, 1, the paper's grid (docs/calibration.md)",
    )


class FedProx(FedAvg):
    name = "fedprox"

    def __init__(
        self,
        params: FedProxParams,
        server_optimizer: ServerOptimizerConfig = ServerOptimizerConfig(),
        privacy: ResolvedPrivacy | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(server_optimizer, privacy=privacy, seed=seed)
        self.params = params

    def local_update(self, ctx: ClientContext, state: None, task: ClientTask, objects: Mapping[str, Any]) -> tuple[Upload, None]:
        broadcast = objects["global"]
        regulariser = None
        if self.params.mu > 0:
            regulariser = proximal_regulariser(ctx, [broadcast], np.ones(1), self.params.mu)
        ctx.load(broadcast)
        stats = ctx.train(regulariser=regulariser)
        # the training loss includes the proximal term, as minimised
        if "clip" in task.payload:  # privacy: the clipped update, never the model
            clip = float(task.payload["clip"])
            update, norm = clipped_update(broadcast, ctx.snapshot(), clip, with_head=True)
            return private_upload(ctx.client_id, stats.num_samples, stats.mean_loss, stats.steps, update, norm, clip), None
        upload = Upload(ctx.client_id, stats.num_samples, stats.mean_loss, stats.steps, models={"model": ctx.snapshot()})
        return upload, None


METHOD = MethodSpec(
    name="fedprox",
    summary="FedProx: FedAvg with a proximal pull of each local update towards the downloaded global model",
    params=FedProxParams,
    build=lambda params, run: FedProx(params, run.server_optimizer, privacy=run.privacy, seed=run.seed),
    applies_server_optimizer=True,
    auto_knobs=(AutoKnob("mu", (0.001, 0.01, 0.1, 1.0), beyond=tenfold),),
    newcomer_rule=GLOBAL_MODEL_RULE,
    privacy=PrivacyRule(
        sends="the global model's update (encoder and head) after the proximal local training, clipped: one noised mean a round"
    ),
)
