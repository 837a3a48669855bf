"""protocol.server_optimizer on every method that shares a model: `avgm` without momentum
at lr 1 gives the default's bits; adam steps each shared model (global model or encoder,
each cluster model with moments of its own) from the round's mean, leaves a cluster
without an update alone, keeps HDC-FL's prototypes plain means, and sends exactly the
bytes the default sends; FedBuff steps on each flushed buffer."""

from __future__ import annotations

import copy
from typing import Any, Callable

import numpy as np
import pytest

from hdcfl_ray.algorithms.registry import method_names, method_specs
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.contract import ModelParams, ServerOptimizerConfig
from hdcfl_ray.maths.server_optimizer import Moments, step_vector
from hdcfl_ray.runtime.backends.local_host import in_process_run
from hdcfl_ray.runtime.driver import prepare_run
from hdcfl_ray.runtime.server.round_tail import RoundReport
from tests.conftest import SMALL_FEDERATION_METHODS, slow_beyond, tiny_scenario

ADAM = {"name": "adam", "lr": 0.01, "tau": 1e-3}
DEFAULT_BY_ANOTHER_NAME = {"name": "avgm", "momentum": 0.0, "lr": 1.0}


def _model(state: Any) -> dict[str, ModelParams]:
    return {"global": state.model}


def _encoder(state: Any) -> dict[str, ModelParams]:
    return {"global": ModelParams(state.global_encoder)}


def _clusters(field: str) -> Callable[[Any], dict[str, ModelParams]]:
    return lambda state: {f"cluster/{j}": model for j, model in enumerate(getattr(state, field))}


# each method's shared models, by slot: what the server optimiser steps
SHARED: dict[str, Callable[[Any], dict[str, ModelParams]]] = {
    "fedavg": _model, "fedprox": _model, "ditto": _model, "apfl": _model, "fedala": _model, "scaffold": _model, "fednova": _model,
    "fedavg_se": _encoder, "fedrep": _encoder, "fedbabu": _encoder, "hdcfl": _encoder,
    "ifca": _clusters("models"), "pacfl": _clusters("models"), "fedce": _clusters("components"), "fedsoft": _clusters("centres"),
}  # fmt: skip


# methods whose messages' sizes depend on the models' values, not only on the round's clients
SIZES_FOLLOW_THE_MODELS = {"fedce"}


def test_every_method_but_local_declares_that_it_applies_the_server_optimizer() -> None:
    assert set(SHARED) == set(method_names()) - {"local"}
    assert {name for name, spec in method_specs().items() if spec.applies_server_optimizer} == set(SHARED)


def scenario_for(method: str, optimizer: dict[str, Any] | None, **protocol: Any):
    algorithm = {"name": method, **({method: SMALL_FEDERATION_METHODS[method]} if method in SMALL_FEDERATION_METHODS else {})}
    sections = {"rounds": 2, "participation": 1.0, "batch_size": 16, **protocol}
    if optimizer is not None:
        sections["server_optimizer"] = optimizer
    return build_scenario(
        tiny_scenario(
            algorithm=algorithm,
            partition={"kind": "rotation", "num_clients": 6, "angles": [0, 180], "test_per_client": 20},
            protocol=sections,
            runtime={"backend": "local", "num_cpus": 1},
        )
    )


def arrays(value: Any) -> list[np.ndarray]:
    """Every array of a server state, in a fixed order (its moments included)."""
    if isinstance(value, np.ndarray):
        return [value]
    if isinstance(value, dict):
        return [a for key in sorted(value, key=repr) for a in arrays(value[key])]
    if isinstance(value, (list, tuple)):
        return [a for item in value for a in arrays(item)]
    if hasattr(value, "__dataclass_fields__"):
        return [a for name in value.__dataclass_fields__ for a in arrays(getattr(value, name))]
    return []


def outcome(reports: list[RoundReport]) -> list[str]:
    """What a run's rounds reported, as exact text: uploads, scores and bytes."""
    return [
        repr(([(u.client_id, u.train_loss, u.steps, u.accepted) for u in report.uploads],
              [(e.client_id, e.result) for e in report.eval_reports], report.traffic))
        for report in reports
    ]  # fmt: skip


@pytest.mark.parametrize("method", slow_beyond(sorted(SHARED), fast={"fedavg", "fedavg_se", "ifca", "fedsoft"}))
def test_each_method_steps_its_shared_models_and_the_default_keeps_its_bits(method: str) -> None:
    default = in_process_run(prepare_run(scenario_for(method, None)))
    before = copy.deepcopy(SHARED[method](default.server.state))
    reports = [default.run_round(1)]
    if method == "pacfl":  # its clusters are made at round 1's probes, each from the shared initial model
        before = {slot: default.server.state.initial for slot in SHARED[method](default.server.state)}
    means = copy.deepcopy(SHARED[method](default.server.state))  # round 1's uploads are the same in every run
    prototypes = copy.deepcopy(getattr(default.server.state, "personalisation", None))
    reports.append(default.run_round(2))

    renamed = in_process_run(prepare_run(scenario_for(method, DEFAULT_BY_ANOTHER_NAME)))
    assert outcome(renamed.run_all()) == outcome(reports)
    assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(arrays(renamed.server.state), arrays(default.server.state)))

    adam = in_process_run(prepare_run(scenario_for(method, ADAM)))
    first = adam.run_round(1)
    stepped = SHARED[method](adam.server.state)
    config = ServerOptimizerConfig(**ADAM)
    for slot, mean in means.items():
        start = before[slot]
        if np.array_equal(mean.encoder, start.encoder):  # nobody trained this cluster: no step
            assert np.array_equal(stepped[slot].encoder, start.encoder), slot
            continue
        for part in ("encoder", "head"):
            if getattr(mean, part) is None:
                continue
            expected, _ = step_vector(config, Moments(), getattr(start, part), getattr(mean, part))
            assert np.array_equal(getattr(stepped[slot], part), expected), (slot, part)
            assert adam.server.state.server_moments[f"{slot}/{part}"].steps == 1
    if method == "hdcfl":  # round 1 refreshes: the prototypes are the cache's plain means, as without adam
        np.testing.assert_array_equal(adam.server.state.personalisation.prototypes, prototypes.prototypes)
    second = adam.run_round(2)
    # the optimiser's state never travels: every client moved the bytes it moved without it
    # (FedCE's clients upload the components they hold a share of, which the models decide)
    assert first.traffic == reports[0].traffic
    assert second.traffic == reports[1].traffic or method in SIZES_FOLLOW_THE_MODELS


@pytest.mark.parametrize("method", ["fedavg", "hdcfl"])
def test_fedbuff_steps_the_optimiser_once_per_flushed_buffer_and_the_default_keeps_its_bits(method: str) -> None:
    fedbuff = {"mode": "async", "rounds": 3, "asynchronous": {"concurrency": 3, "aggregation": "fedbuff", "buffer_size": 2}}
    default = in_process_run(prepare_run(scenario_for(method, None, **fedbuff)))
    default_reports = default.run_all()
    renamed = in_process_run(prepare_run(scenario_for(method, DEFAULT_BY_ANOTHER_NAME, **fedbuff)))
    assert outcome(renamed.run_all()) == outcome(default_reports)
    assert np.array_equal(renamed.algorithm.async_shared(renamed.server.state), default.algorithm.async_shared(default.server.state))
    assert renamed.server.server_moments == Moments()

    adam = in_process_run(prepare_run(scenario_for(method, ADAM, **fedbuff)))
    adam_reports = adam.run_all()
    assert adam.server.server_moments.steps == 3  # one step per server version
    assert adam.server.state.server_moments == {}  # the method's own aggregate never ran
    assert not np.array_equal(adam.algorithm.async_shared(adam.server.state), default.algorithm.async_shared(default.server.state))
    assert [r.traffic for r in adam_reports] == [r.traffic for r in default_reports]
