"""The methods that accept a privacy section: what leaves a client is a clipped update
(and HDC-FL's unit-norm head sketch at a refresh), never a model, an encoder or a head;
a round's mechanism is what docs/privacy.md says; a stopped run resumes to the
uninterrupted run's bits; the methods without a rule refuse (exit 2)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from typer.testing import CliRunner

from cli import app
from hdcfl_ray.algorithms.private_updates import UPDATE, WITHIN_CLIP
from hdcfl_ray.algorithms.registry import method_specs
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.contract import ModelParams, Upload
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.terminal.live_view import QuietObserver
from tests.conftest import tiny_scenario
from tests.stop_observer import resume_after_a_stop

pytest.importorskip("opacus", reason="the accountant needs Opacus: pip install 'hdcfl-ray[dp]'")

PRIVATE_METHODS = ("fedavg", "fedavg_se", "hdcfl", "ifca")
ALLOWED_VALUES = {WITHIN_CLIP, "cluster", "head_sketch"}
CLIP = 0.5


def private(method: str, rounds: int = 3, **privacy: object) -> dict:
    return tiny_scenario(
        algorithm={"name": method, "ifca": {"clusters": 2}},
        privacy={"noise_multiplier": 1.0, "clip": CLIP, "noise_cohort_size": 500, **privacy},
        protocol={"rounds": rounds, "participation": 4},
        runtime={"backend": "local", "num_cpus": 1},
    )


def test_the_methods_that_accept_privacy_are_the_ones_with_a_rule() -> None:
    accepting = sorted(name for name, spec in method_specs().items() if spec.privacy is not None)
    assert set(PRIVATE_METHODS) <= set(accepting)


@pytest.mark.parametrize("method", PRIVATE_METHODS)
def test_what_leaves_a_client_is_a_clipped_update_never_a_model(method: str, tmp_path, monkeypatch) -> None:
    seen: list[Upload] = []
    spec = method_specs()[method]
    built_class = _method_class(method)
    original = built_class.aggregate

    def recording(self, state, round_index, uploads):
        seen.extend(uploads)
        return original(self, state, round_index, uploads)

    monkeypatch.setattr(built_class, "aggregate", recording)
    run_simulation(prepare_run(build_scenario(private(method))), tmp_path / "run", QuietObserver())
    assert seen, f"{spec.name}: no upload reached the server"
    for upload in seen:
        assert set(upload.models) == {UPDATE}, upload.models.keys()
        assert set(upload.values) <= ALLOWED_VALUES, upload.values.keys()
        update = upload.models[UPDATE]
        assert isinstance(update, ModelParams)
        parts = [update.encoder] + ([] if update.head is None else [update.head])
        norm = math.sqrt(sum(float(np.sum(np.asarray(part, np.float64) ** 2)) for part in parts))
        assert norm <= CLIP * (1 + 1e-5)
        if method in ("fedavg_se", "hdcfl"):
            assert update.head is None  # the head stays on the client
        if "head_sketch" in upload.values:
            assert np.linalg.norm(upload.values["head_sketch"]) == pytest.approx(1.0, abs=1e-6)
    if method == "hdcfl":
        assert any("head_sketch" in upload.values for upload in seen)


CLASSES = {"fedavg": "FedAvg", "fedavg_se": "FedAvgSE", "hdcfl": "HDCFL", "ifca": "IFCA"}


def _method_class(method: str) -> type:
    import importlib

    return getattr(importlib.import_module(f"hdcfl_ray.algorithms.{method}"), CLASSES[method])


@pytest.mark.parametrize("method", ("hdcfl", "ifca"))
def test_a_private_run_resumes_to_the_uninterrupted_runs_bits(method: str, tmp_path) -> None:
    scenario = build_scenario(private(method, rounds=4, adaptive_clip={"count_noise_multiplier": 5.0}))
    resume_after_a_stop(scenario, tmp_path, stop_after=2)


def test_hdcfl_under_privacy_logs_its_groups_and_spends_three_releases_at_a_refresh(tmp_path) -> None:
    from hdcfl_ray.logs.table_writer import read_table
    from hdcfl_ray.privacy.accountant import epsilon

    run_dir = tmp_path / "run"
    scenario = build_scenario(private("hdcfl", rounds=3))
    prepared = prepare_run(scenario)
    run_simulation(prepared, run_dir, QuietObserver())
    refresh = read_table(run_dir, "refresh").to_pylist()
    assert {row["round"] for row in refresh} == {2, 3}  # activation_round 2, refresh_every 1
    q = 4 / 8  # participation 4 of the 8 clients, Poisson
    rounds = sorted(read_table(run_dir, "rounds").to_pylist(), key=lambda row: row["round"])
    # round 1: the encoder's mean; rounds 2 and 3: the mean, the sketches and the group sums
    expected = [epsilon([(1.0, q, steps)], 1e-5) for steps in (1, 4, 7)]
    assert [row["epsilon"] for row in rounds] == pytest.approx(expected, rel=1e-9)


def test_a_method_without_a_privacy_rule_is_refused_naming_it(write_scenario) -> None:
    refused = sorted(name for name, spec in method_specs().items() if spec.privacy is None)
    assert refused, "every method accepts privacy: pick another check"
    path = write_scenario(private(refused[0]))
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    assert "privacy" in result.output and refused[0] in result.output
