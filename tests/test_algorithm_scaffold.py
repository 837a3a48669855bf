"""SCAFFOLD (option II): the correction <c - c_k, w> adds exactly c - c_k to every
gradient; the control update; round 1 (zero control variates, eta_g = 1) is FedAvg's bit
for bit; the server's c stays the mean of every client's c_k under partial participation;
BatchNorm statistics get no control variate and are averaged as FedAvg does at any eta_g;
the recorded bytes are twice FedAvg's both ways; Adam and the asynchronous mode are refused
(exit 2); a stopped run resumes to the uninterrupted run's bits (locally, and on Ray in
the slow tier)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

from hdcfl_ray.algorithms.scaffold import CONTROL, Scaffold, ScaffoldClient, ScaffoldParams
from hdcfl_ray.algorithms.scaffold_control import linear_correction, parameter_masks, statistics_prescaled, updated_control
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.contract import ModelParams
from hdcfl_ray.models.flat import FlatIndex
from hdcfl_ray.runtime.backends.local_host import in_process_run
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.terminal.live_view import QuietObserver
from tests.cli_exit import assert_refused
from tests.conftest import slow_beyond, tiny_scenario
from tests.stop_observer import resume_after_a_stop



def bn_context() -> SimpleNamespace:
    """A client context's model parts with a BatchNorm encoder (statistics in the flat vector)."""
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    head = nn.Linear(4, 2)
    return SimpleNamespace(
        model=SimpleNamespace(encoder=encoder, head=head), encoder_index=FlatIndex.of(encoder), head_index=FlatIndex.of(head)
    )


def test_the_correction_adds_exactly_c_minus_ck_to_every_gradient() -> None:
    ctx = bn_context()
    encoder_mask, head_mask = parameter_masks(ctx)
    # BatchNorm's running mean and variance are in the flat vector but are no parameters
    assert encoder_mask.size == 3 * 4 + 4 + 4 + 4 + 4 + 4 and int(encoder_mask.sum()) == 3 * 4 + 4 + 4 + 4
    assert head_mask.all()
    rng = np.random.default_rng(0)
    correction = ModelParams(rng.normal(size=encoder_mask.size).astype(np.float32), rng.normal(size=head_mask.size).astype(np.float32))
    term = linear_correction(ctx, correction)
    inputs = torch.randn(5, 3)
    parameters = [*ctx.model.encoder.parameters(), *ctx.model.head.parameters()]
    plain = torch.autograd.grad(ctx.model.head(ctx.model.encoder(inputs)).sum(), parameters)
    corrected = torch.autograd.grad(ctx.model.head(ctx.model.encoder(inputs)).sum() + term(ctx.model), parameters)
    flat_correction = np.concatenate([correction.encoder[encoder_mask], correction.head])
    gained = np.concatenate([(c - p).detach().numpy().ravel() for c, p in zip(corrected, plain)])
    np.testing.assert_allclose(gained, flat_correction, rtol=0, atol=1e-6)


def test_option_two_updates_the_parameters_entries_and_leaves_statistics_at_zero() -> None:
    mask = np.array([True, True, False])
    own = ModelParams(np.array([0.5, -1.0, 0.0], np.float32), np.array([2.0], np.float32))
    server = ModelParams(np.array([0.25, 1.0, 0.0], np.float32), np.array([-1.0], np.float32))
    start = ModelParams(np.array([1.0, 1.0, 3.0], np.float32), np.array([1.0], np.float32))
    trained = ModelParams(np.array([0.0, 2.0, 5.0], np.float32), np.array([0.5], np.float32))
    new = updated_control(own, server, start, trained, (mask, np.array([True])), scale=4.0)
    np.testing.assert_allclose(new.encoder, [0.5 - 0.25 + 1.0 / 4, -1.0 - 1.0 - 1.0 / 4, 0.0])
    np.testing.assert_allclose(new.head, [2.0 + 1.0 + 0.5 / 4])
    assert updated_control(own, server, start, trained, (mask, np.array([True])), scale=0.0) is own


def scaffold_run(protocol: dict, partition: dict | None = None, **params: Any):
    sections: dict[str, Any] = {"algorithm": {"name": "scaffold", "scaffold": params}, "protocol": protocol}
    if partition is not None:
        sections["partition"] = partition
    scenario = build_scenario(tiny_scenario(**sections))
    return in_process_run(prepare_run(scenario))


def fedavg_run(protocol: dict):
    return in_process_run(prepare_run(build_scenario(tiny_scenario(algorithm={"name": "fedavg"}, protocol=protocol))))


def test_round_one_is_fedavg_bit_for_bit_and_c_becomes_the_clients_mean() -> None:
    protocol = {"rounds": 1, "participation": 0.5}
    scaffold, avg = scaffold_run(protocol), fedavg_run(protocol)
    (ours,), (theirs,) = scaffold.run_all(), avg.run_all()
    assert ours.selected == theirs.selected
    assert np.array_equal(scaffold.server.state.model.encoder, avg.server.state.model.encoder)
    assert np.array_equal(scaffold.server.state.model.head, avg.server.state.model.head)
    assert [(u.client_id, u.train_loss) for u in ours.uploads] == [(u.client_id, u.train_loss) for u in theirs.uploads]
    states = scaffold.host.client_states
    assert all(states[k].control is None for k in range(8) if k not in ours.selected)
    trained = [states[k].control for k in ours.selected]
    assert all(np.abs(c.encoder).max() > 0 for c in trained)
    # c = (1/N) sum_k c_k, the clients that have not trained counting zero
    expected = np.sum([c.encoder.astype(np.float64) for c in trained], axis=0) / 8
    np.testing.assert_allclose(scaffold.server.state.control.encoder, expected, rtol=1e-5, atol=1e-7)


def test_c_stays_the_mean_of_every_clients_control_variate_under_partial_participation() -> None:
    run = scaffold_run({"rounds": 3, "participation": 0.5})
    reports = run.run_all()
    assert len({k for report in reports for k in report.selected}) > 4  # other clients each round
    controls = [run.host.client_states[k].control for k in range(8)]
    for part in ("encoder", "head"):
        mean = np.sum([getattr(c, part).astype(np.float64) for c in controls if c is not None], axis=0) / 8
        np.testing.assert_allclose(getattr(run.server.state.control, part), mean, rtol=1e-4, atol=1e-6)
    # from round 2 on the correction is on: the model leaves FedAvg's
    avg = fedavg_run({"rounds": 3, "participation": 0.5})
    avg.run_all()
    assert not np.array_equal(run.server.state.model.encoder, avg.server.state.model.encoder)


def test_a_server_lr_scales_the_step_and_statistics_are_averaged_as_fedavg_does() -> None:
    ctx = bn_context()
    masks = parameter_masks(ctx)
    x = ModelParams(np.linspace(0, 1, masks[0].size).astype(np.float32), np.zeros(masks[1].size, np.float32))
    ys = [ModelParams(x.encoder + 0.1 * (k + 1), x.head - 0.2 * k) for k in range(2)]
    method = Scaffold(ScaffoldParams(server_lr=2.0))
    state = method.init_server(x, [], num_clients=2)
    uploads = []
    for k, y in enumerate(ys):
        uploaded = statistics_prescaled(x, y, masks, 2.0)
        zero = ModelParams(np.zeros_like(x.encoder), np.zeros_like(x.head))
        uploads.append(SimpleNamespace(client_id=k, num_samples=10 * (k + 1), train_loss=1.0, models={"model": uploaded, CONTROL: zero}))
    method.aggregate(state, 1, uploads)  # type: ignore[arg-type]
    mean = (10 * ys[0].encoder.astype(np.float64) + 20 * ys[1].encoder) / 30
    expected = np.where(masks[0], x.encoder + 2.0 * (mean - x.encoder), mean)
    np.testing.assert_allclose(state.model.encoder, expected, rtol=1e-6, atol=1e-6)


def test_the_state_is_kept_per_client() -> None:
    method = Scaffold(ScaffoldParams())
    assert method.init_client(0, ModelParams(np.zeros(2, np.float32))) == ScaffoldClient()


def bytes_rows(run_dir: Path, method: str) -> list[tuple[int, int, int, int, int, bool]]:
    scenario = build_scenario(
        tiny_scenario(algorithm={"name": method}, protocol={"rounds": 2, "participation": 0.5}, runtime={"backend": "local", "num_cpus": 1})
    )
    run_simulation(prepare_run(scenario), run_dir, QuietObserver())
    rows = pq.read_table(run_dir / "clients.parquet").to_pylist()
    return sorted((r["round"], r["client_id"], r["bytes_up"], r["bytes_down"], r["eval_bytes_down"], r["participated"]) for r in rows)


def test_the_recorded_bytes_are_twice_fedavgs_up_and_down(tmp_path: Path) -> None:
    ours, theirs = bytes_rows(tmp_path / "scaffold", "scaffold"), bytes_rows(tmp_path / "fedavg", "fedavg")
    assert [row[:2] + row[5:] for row in ours] == [row[:2] + row[5:] for row in theirs]  # the same clients trained
    assert any(row[5] for row in ours)
    for mine, fedavg in zip(ours, theirs):
        assert (mine[2], mine[3]) == (2 * fedavg[2], 2 * fedavg[3]), mine
        assert mine[4] == fedavg[4]  # evaluation downloads x only
    rounds = {name: pq.read_table(tmp_path / name / "rounds.parquet").to_pylist() for name in ("scaffold", "fedavg")}
    for mine, fedavg in zip(rounds["scaffold"], rounds["fedavg"]):
        assert (mine["bytes_up"], mine["bytes_down"]) == (2 * fedavg["bytes_up"], 2 * fedavg["bytes_down"]) != (0, 0)


@pytest.mark.parametrize(
    ("protocol", "command", "expected"),
    [
        ({"optimizer": {"name": "adam", "lr": 0.001}}, "validate", ["protocol.optimizer.name: adam", "set protocol.optimizer.name: sgd"]),
        ({"optimizer": {"name": "adam", "lr": 0.001}}, "simulate", ["protocol.optimizer.name: adam", "set protocol.optimizer.name: sgd"]),
        ({"mode": "async"}, "simulate", ["protocol.mode", "scaffold runs synchronous rounds only", "set protocol.mode: sync"]),
    ],
)
def test_bad_input_exits_2_naming_the_key_and_the_fix(write_scenario, tmp_path, protocol, command, expected) -> None:
    path = write_scenario(tiny_scenario(algorithm={"name": "scaffold"}, protocol=protocol))
    assert_refused(command, path, tmp_path, expected)


@pytest.mark.parametrize("backend", slow_beyond(["local", "ray"], fast={"local"}))
def test_a_stopped_run_resumes_to_the_bits_of_the_uninterrupted_run(tmp_path: Path, backend: str, request: pytest.FixtureRequest) -> None:
    if backend == "ray":
        request.getfixturevalue("ray_session")
    scenario = build_scenario(
        tiny_scenario(
            algorithm={"name": "scaffold"},
            protocol={"rounds": 4, "participation": 0.5},
            runtime={"backend": backend, "num_cpus": 1} if backend == "local" else {"backend": backend},
            checkpoint={"every": 2},
        )
    )
    resume_after_a_stop(scenario, tmp_path)  # checkpoint at round 2: c and every c_k saved


def test_a_round_whose_local_objective_falls_below_zero_logs_that_it_diverges() -> None:
    from hdcfl_ray.contract import Upload

    scaffold = Scaffold(ScaffoldParams())
    initial = ModelParams(encoder=np.zeros(3, np.float32), head=np.zeros(2, np.float32))
    state = scaffold.init_server(initial, [], num_clients=2)

    def upload(client_id: int, loss: float) -> Upload:
        return Upload(client_id, 10, loss, 5, models={"model": initial, CONTROL: initial})

    assert scaffold.aggregate(state, 1, [upload(0, 0.4), upload(1, 0.1)]).events == ()
    (event,) = scaffold.aggregate(state, 2, [upload(0, 0.4), upload(1, -0.2)]).events
    assert "round 2" in event and "below zero at 1 of 2 clients" in event and "protocol.optimizer.lr" in event
