"""The optimiser settings a client trains with (the protocol's, or a method's own,
e.g. FedBABU's fine-tuning)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hdcfl_ray.contract.section import Section


class OptimizerConfig(Section):
    name: Literal["sgd", "adam"] = Field("sgd", description="sgd | adam")
    lr: float = Field(0.05, gt=0.0, description="learning rate")
    momentum: float = Field(0.9, ge=0.0, lt=1.0, description="SGD momentum (adam ignores it)")
    weight_decay: float = Field(5.0e-4, ge=0.0, description="L2 weight decay")
