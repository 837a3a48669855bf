"""Calibrating one data-dependent knob on one setting: the runs of a sweep over its
values (each a setting of its own, named `<scenario>.<knob>-<value>`), so that a
threshold, a proximal coefficient or a cluster count is chosen on the setting it
is used in, with the evidence (accuracy, groups found, ARI against the planted
groups, budget) in one table.

By default every run holds out a share of each client's training images and is
scored on them (`partition.validation_fraction`), so the choice never reads the
test set; `oracle=True` scores on the test set instead and the table then
chooses nothing (analysis/calibration_table.py)."""

from __future__ import annotations

import re
from pathlib import Path

from hdcfl_ray.config.loading import apply_overrides, read_scenario_file
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.sweeps.grid import SweepPlan, SweepRun, expand

_UNSAFE_NAME_CHARACTERS = re.compile(r"[^A-Za-z0-9._-]+")
# a fifth of each client's training images: enough to rank values, little enough to train on
DEFAULT_VALIDATION_FRACTION = 0.2


def variant_name(setting: str, key: str, value: str) -> str:
    """`cpu-c10-ls3` + `algorithm.pacfl.threshold` + `2.5` -> `cpu-c10-ls3.threshold-2.5`
    (reports read `base.variant` as a variant of `base`)."""
    leaf = key.rsplit(".", 1)[-1]
    text = _UNSAFE_NAME_CHARACTERS.sub("_", value.strip()).strip("_") or "empty"
    return f"{setting}.{leaf}-{text}"


def calibration_runs(
    scenario_file: Path,
    key: str,
    values: tuple[str, ...],
    algorithm: str | None,
    seeds: tuple[int, ...] | None,
    overrides: tuple[str, ...],
    out: Path,
    validation_fraction: float | None = DEFAULT_VALIDATION_FRACTION,
) -> list[SweepRun]:
    """One validated run per (value, seed); errors name the value that is invalid.
    `validation_fraction` None: the runs are scored on the test set (oracle)."""
    if not key or "=" in key:
        raise ScenarioError(f"--key {key!r}: give one dotted scenario key, e.g. algorithm.pacfl.threshold")
    if not values:
        raise ScenarioError("--values: give a comma-separated list of values, e.g. 1.5,2.5,4")
    if validation_fraction is not None and not 0.0 < validation_fraction < 1.0:
        raise ScenarioError(f"--validation-fraction {validation_fraction}: give a fraction between 0 and 1, e.g. 0.2")
    if validation_fraction is not None:
        overrides = (*overrides, f"partition.validation_fraction={validation_fraction}")
    setting = str(apply_overrides(read_scenario_file(scenario_file), list(overrides)).get("name", scenario_file.stem))
    if validation_fraction is None:
        setting = f"{setting}.oracle"  # never the same setting name as a validation-scored calibration
    runs: list[SweepRun] = []
    for value in values:
        variant = (*overrides, f"{key}={value}", f"name={variant_name(setting, key, value)}")
        try:
            runs += expand(SweepPlan((scenario_file,), (algorithm,) if algorithm else None, seeds, variant, out))
        except ScenarioError as error:
            raise ScenarioError(f"--values: {key}={value}: {error}") from None
    return runs
