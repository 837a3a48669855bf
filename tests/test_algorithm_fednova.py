"""FedNova: FedAvg with each client's update normalised by its momentum-aware local step
count a_k. The normaliser is the distance momentum SGD moves for a unit gradient; the
server takes x - tau_eff sum p_k d_k; with equal local steps that is FedAvg's average up
to float32 rounding; Adam and the asynchronous mode are refused (exit 2); a stopped run
resumes to the uninterrupted run's bits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hdcfl_ray.algorithms.fednova import DIRECTION, NORMALISER, FedNova
from hdcfl_ray.algorithms.fedavg import GlobalModelState
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.contract import ModelParams, Upload
from hdcfl_ray.maths.local_steps import momentum_step_count
from hdcfl_ray.runtime.backends.local_host import in_process_run
from hdcfl_ray.runtime.driver import prepare_run
from hdcfl_ray.training.local_training import MomentumSGD
from tests.cli_exit import assert_refused
from tests.conftest import tiny_scenario
from tests.stop_observer import resume_after_a_stop



@pytest.mark.parametrize("momentum", [0.0, 0.5, 0.9])
@pytest.mark.parametrize("steps", [0, 1, 2, 7, 25])
def test_the_normaliser_is_how_far_momentum_sgd_moves_for_a_unit_gradient(steps: int, momentum: float) -> None:
    direct = sum((1 - momentum ** (j + 1)) / (1 - momentum) for j in range(steps)) if momentum else float(steps)
    assert momentum_step_count(steps, momentum) == pytest.approx(direct, rel=1e-12)
    weight = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    optimizer = MomentumSGD([weight], lr=0.1, momentum=momentum, weight_decay=0.0)
    for _ in range(steps):
        weight.grad = torch.ones(1, dtype=torch.float64)
        optimizer.step()
    assert -float(weight.detach()) / 0.1 == pytest.approx(momentum_step_count(steps, momentum), rel=1e-12)
    if momentum == 0.0:
        assert momentum_step_count(steps, 0.0) == steps


def test_the_server_steps_by_tau_eff_times_the_weighted_mean_direction() -> None:
    x = ModelParams(np.array([1.0, 2.0], np.float32), np.array([0.5], np.float32))
    uploads = [
        Upload(3, 30, 0.0, 10, models={DIRECTION: ModelParams(np.array([0.1, -0.2], np.float32), np.array([0.3], np.float32))}, values={NORMALISER: 10.0}),
        Upload(1, 10, 0.0, 2, models={DIRECTION: ModelParams(np.array([0.4, 0.0], np.float32), np.array([-0.1], np.float32))}, values={NORMALISER: 2.0}),
    ]
    state = GlobalModelState(model=x)
    FedNova().aggregate(state, 1, uploads)
    p = np.array([0.25, 0.75])  # client 1 (10 samples), client 3 (30)
    tau_eff = 0.25 * 2.0 + 0.75 * 10.0
    d_enc = p[0] * np.array([0.4, 0.0]) + p[1] * np.array([0.1, -0.2])
    d_head = p[0] * -0.1 + p[1] * 0.3
    np.testing.assert_allclose(state.model.encoder, np.array([1.0, 2.0]) - tau_eff * d_enc, rtol=1e-6)
    np.testing.assert_allclose(state.model.head, np.array([0.5]) - tau_eff * d_head, rtol=1e-6)
    assert state.model.encoder.dtype == np.float32


def run_of(method: str, protocol: dict, partition: dict | None = None):
    sections = {"algorithm": {"name": method}, "protocol": protocol}
    if partition is not None:
        sections["partition"] = partition
    return in_process_run(prepare_run(build_scenario(tiny_scenario(**sections))))


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_with_equal_local_steps_fednova_is_fedavg_to_float32_rounding(momentum: float) -> None:
    protocol = {"rounds": 2, "participation": 1.0, "optimizer": {"momentum": momentum}}
    partition = {"kind": "iid", "num_clients": 4, "test_per_client": 20}
    nova, avg = run_of("fednova", protocol, partition), run_of("fedavg", protocol, partition)
    reports = nova.run_all()
    avg.run_all()
    steps = {u.steps for report in reports for u in report.uploads}
    assert len(steps) == 1, steps  # equal local steps: equal a_k (both rules weight by samples)
    for part in ("encoder", "head"):
        ours, theirs = getattr(nova.server.state.model, part), getattr(avg.server.state.model, part)
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=5e-6 * max(1.0, float(np.abs(theirs).max())))
    assert not np.array_equal(nova.server.state.model.encoder, nova.server.state.model.encoder * 0)


def test_unequal_local_steps_move_off_fedavg() -> None:
    protocol = {"rounds": 1, "participation": 1.0}
    partition = {"kind": "dirichlet", "num_clients": 4, "alpha": 0.3, "test_per_client": 20}
    nova, avg = run_of("fednova", protocol, partition), run_of("fedavg", protocol, partition)
    (report,) = nova.run_all()
    avg.run_all()
    assert len({u.steps for u in report.uploads}) > 1
    assert np.abs(nova.server.state.model.encoder - avg.server.state.model.encoder).max() > 1e-4


@pytest.mark.parametrize(
    ("protocol", "command", "expected"),
    [
        ({"optimizer": {"name": "adam", "lr": 0.001}}, "validate", ["protocol.optimizer.name: adam", "set protocol.optimizer.name: sgd"]),
        ({"mode": "async"}, "simulate", ["protocol.mode", "fednova runs synchronous rounds only", "set protocol.mode: sync"]),
    ],
)
def test_bad_input_exits_2_naming_the_key_and_the_fix(write_scenario, tmp_path, protocol, command, expected) -> None:
    path = write_scenario(tiny_scenario(algorithm={"name": "fednova"}, protocol=protocol))
    assert_refused(command, path, tmp_path, expected)


def test_a_stopped_run_resumes_to_the_bits_of_the_uninterrupted_run(tmp_path: Path) -> None:
    scenario = build_scenario(
        tiny_scenario(
            algorithm={"name": "fednova"},
            partition={"kind": "dirichlet", "num_clients": 6, "alpha": 0.5, "test_per_client": 20},
            protocol={"rounds": 4, "participation": 0.5},
            runtime={"backend": "local", "num_cpus": 1},
            checkpoint={"every": 2},
        )
    )
    resume_after_a_stop(scenario, tmp_path)  # checkpoint at round 2
