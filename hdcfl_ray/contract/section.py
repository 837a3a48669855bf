"""The base of every settings section, a method's parameters included: frozen,
validated, and closed to unknown keys so that a typo stops a run before it starts."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    # NaN and infinity are refused in every float key: no setting means either, and
    # keys without bounds (a distribution's mean) would otherwise take them
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
