"""Asynchronous federation: virtual-finish order, staleness weights, reproducibility."""

from __future__ import annotations

import numpy as np
import pytest

from hdcfl_ray.algorithms.async_mixing import fedasync_mix, fedbuff_step, staleness_weight
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.runtime.backends.local_host import in_process_run
from hdcfl_ray.runtime.driver import prepare_run
from tests.conftest import tiny_scenario


def async_scenario(aggregation: str, algorithm: str = "fedavg_se", **asynchronous):
    return build_scenario(
        tiny_scenario(
            algorithm={"name": algorithm, "hdcfl": {"groups": 2, "activation_round": 2, "refresh_every": 2}},
            protocol={
                "mode": "async",
                "rounds": 5,
                "asynchronous": {"concurrency": 3, "aggregation": aggregation, "buffer_size": 2, **asynchronous},
                "system": {"speed": {"kind": "lognormal", "mean": 4.0, "sigma": 0.8}},
            },
        )
    )


def test_staleness_weight_is_polynomial_decay():
    assert staleness_weight(0, 0.5) == 1.0
    assert staleness_weight(3, 0.5) == pytest.approx(0.5)
    assert staleness_weight(7, 1.0) == pytest.approx(1 / 8)
    assert staleness_weight(5, 0.0) == 1.0
    with pytest.raises(ValueError):
        staleness_weight(-1, 0.5)


def test_fedasync_mix_uses_the_staleness_weighted_mixing_rate():
    shared, update = np.zeros(3, np.float32), np.ones(3, np.float32)
    assert np.allclose(fedasync_mix(shared, update, mixing=0.6, staleness=3, exponent=0.5), 0.3)


def test_fedbuff_step_averages_weighted_deltas():
    shared = np.array([1.0, 1.0], np.float32)
    updates = [np.array([3.0, 1.0], np.float32), np.array([1.0, 5.0], np.float32)]
    bases = [np.array([1.0, 1.0], np.float32), np.array([1.0, 1.0], np.float32)]
    stepped = fedbuff_step(shared, updates, bases, [0, 3], exponent=0.5, server_lr=1.0)
    # deltas (2, 0) * 1 and (0, 4) * 0.5, mean -> (1, 1)
    assert np.allclose(stepped, [2.0, 2.0])


def test_updates_are_applied_in_virtual_finish_order_with_the_formula():
    scenario = async_scenario("fedasync", mixing=0.5, staleness_exponent=1.0)
    run = in_process_run(prepare_run(scenario))
    finishes, previous = [], run.server.state.global_encoder.copy()
    for round_index in range(1, 6):
        report = run.run_round(round_index)
        (timing,) = report.timings  # FedAsync: one update per server version
        finishes.append((timing.virtual_finish, timing.client_id))
        cached = run.server.state.cache[timing.client_id].encoder
        expected = fedasync_mix(previous, cached, 0.5, timing.staleness, 1.0)
        assert np.allclose(run.server.state.global_encoder, expected, atol=1e-6)
        assert report.virtual_time == timing.virtual_finish
        previous = run.server.state.global_encoder.copy()
    assert finishes == sorted(finishes)


def test_fedbuff_applies_every_b_updates():
    run = in_process_run(prepare_run(async_scenario("fedbuff")))
    reports = run.run_all()
    assert all(len(r.timings) == 2 and {t.status for t in r.timings} == {"buffered"} for r in reports)
    finishes = [(t.virtual_finish, t.client_id) for r in reports for t in r.timings]
    assert finishes == sorted(finishes)


def test_two_async_runs_with_the_same_seed_give_identical_metrics():
    def metrics():
        run = in_process_run(prepare_run(async_scenario("fedasync", algorithm="hdcfl")))
        return [
            (r.round_index, [(e.client_id, e.result.headline, e.result.references[e.result.headline].accuracy) for e in r.eval_reports])
            for r in run.run_all()
        ]

    first = metrics()
    assert first == metrics()
    assert any(headline == "personalized" for _, rows in first for _, headline, _ in rows)


def test_async_mode_refuses_a_synchronous_only_method(write_scenario):
    from typer.testing import CliRunner

    from cli import app

    path = write_scenario(tiny_scenario(algorithm={"name": "ifca"}, protocol={"mode": "async"}))
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2
    assert "protocol.mode" in result.output
