"""The server optimiser's settings (`protocol.server_optimizer`): the rule that turns a
round's mean of the clients' models into the next shared model (docs/baselines.md,
"Server optimisers"). The maths is hdcfl_ray/maths/server_optimizer.py."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hdcfl_ray.contract.section import Section

ServerRule = Literal["sgd", "avgm", "adam", "yogi", "adagrad"]


class ServerOptimizerConfig(Section):
    name: ServerRule = Field(
        "sgd",
        description="the rule for the pseudo-gradient delta = the clients' mean minus the current model: sgd x += lr "
        "delta (at lr 1 the mean itself, FedAvg), avgm FedAvgM's momentum, adam / yogi / adagrad Reddi et al.'s "
        "FedOpt (docs/baselines.md)",
    )
    lr: float = Field(1.0, gt=0.0, description="eta, the server's learning rate (the adaptive rules want far less than 1, e.g. 0.01)")
    momentum: float = Field(0.0, ge=0.0, lt=1.0, description="avgm: mu of m = mu m + delta (0 = sgd)")
    beta1: float = Field(0.9, ge=0.0, lt=1.0, description="adam, yogi, adagrad: beta1 of the first moment m = beta1 m + (1 - beta1) delta")
    beta2: float = Field(0.99, ge=0.0, lt=1.0, description="adam, yogi: beta2 of the second moment v")
    tau: float = Field(1.0e-3, gt=0.0, description="adam, yogi, adagrad: tau of the step lr m / (sqrt(v) + tau), the degree of adaptivity")
    bias_correction: bool = Field(
        False,
        description="adam, yogi: scale lr by sqrt(1 - beta2^t) / (1 - beta1^t) at the slot's t-th step (Kingma and Ba's "
        "correction); false = Reddi et al.'s Algorithm 2, as FL-bench",
    )

    @property
    def is_identity(self) -> bool:
        """Whether the step returns the clients' mean itself (sgd, or avgm without momentum,
        at lr 1): the default, FedAvg's server bit for bit."""
        return self.name in ("sgd", "avgm") and self.lr == 1.0 and (self.name == "sgd" or self.momentum == 0.0)
