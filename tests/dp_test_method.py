"""A method that accepts a privacy section, for the tests of the privacy plumbing (config,
sampling, accounting) apart from any real method's maths: FedAvg whose aggregate reports
one release at z per round, an empty round included. It clips and noises nothing: what
is tested is what the runtime does with the releases a method reports. A second method
declares no privacy rule.

Loaded as a plugin (`dp_method` fixture of the tests that use it)."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Iterator

import pytest

from hdcfl_ray import plugins
from hdcfl_ray.algorithms.fedavg import FedAvg
from hdcfl_ray.contract import MethodSpec, PrivacyRule, ResolvedPrivacy, RoundNotes, RunInfo, Upload

NAME = "dp_test_avg"
MODULE = "tests.dp_test_method"

# (round, number of uploads) of every aggregate call, and the RunInfo.privacy each build got
AGGREGATED: list[tuple[int, int]] = []
BUILT_WITH: list[ResolvedPrivacy | None] = []


class ReleasingAvg(FedAvg):
    name = NAME

    def __init__(self, run: RunInfo) -> None:
        super().__init__(run.server_optimizer)  # FedAvg's own privacy path stays off: only the release is reported
        self.run_privacy = run.privacy

    def aggregate(self, state: Any, round_index: int, uploads: list[Upload]) -> RoundNotes:
        AGGREGATED.append((round_index, len(uploads)))
        notes = super().aggregate(state, round_index, uploads)
        return notes if self.run_privacy is None else replace(notes, releases=(self.run_privacy.release(),))


def _build(params: Any, run: RunInfo) -> ReleasingAvg:
    BUILT_WITH.append(run.privacy)
    return ReleasingAvg(run)


METHOD = MethodSpec(
    name=NAME,
    summary="a test method: FedAvg reporting one release at z per round",
    build=_build,
    privacy=PrivacyRule(sends="the model (a test method: nothing is clipped or noised)", kept_on_client="nothing"),
)

# and one that refuses a privacy section (declares no rule), whatever the built-in methods come to accept
REFUSING_NAME = "dp_test_refusing"
METHODS = (MethodSpec(name=REFUSING_NAME, summary="a test method: FedAvg without a privacy rule", build=lambda params, run: FedAvg()),)


def loaded(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The body of a fixture: this module loaded as a plugin for one test, unloaded after."""
    monkeypatch.delenv(plugins.ENV_VAR, raising=False)
    plugins.load_plugins([MODULE])
    AGGREGATED.clear()
    BUILT_WITH.clear()
    yield NAME
    os.environ.pop(plugins.ENV_VAR, None)
    plugins.clear_caches()  # the module stays imported: the tests read its records
