"""FedProx: FedAvg with a proximal pull of every local update towards the downloaded
global model. mu = 0 is FedAvg bit for bit; a large mu keeps the upload close to
the broadcast model; the method runs end to end and is scored with the global model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from hdcfl_ray.algorithms.fedprox import FedProx
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.runtime.backends.local_host import in_process_run
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.terminal.live_view import QuietObserver
from tests.conftest import tiny_scenario


class RecordingFedProx(FedProx):
    """FedProx that keeps the models uploaded in the last round, by client."""

    def aggregate(self, state, round_index, uploads):
        self.uploads = {u.client_id: u.models["model"] for u in uploads}
        return super().aggregate(state, round_index, uploads)


def fedprox_run(protocol=None, **params):
    scenario = build_scenario(tiny_scenario(algorithm={"name": "fedprox", "fedprox": params}, protocol=protocol or {}))
    return in_process_run(prepare_run(scenario), algorithm=RecordingFedProx(scenario.algorithm.fedprox))


def fedavg_run(protocol=None):
    return in_process_run(prepare_run(build_scenario(tiny_scenario(algorithm={"name": "fedavg"}, protocol=protocol or {}))))


def flat(model) -> np.ndarray:
    return np.concatenate([model.encoder, model.head]).astype(np.float64)


def test_mu_zero_is_fedavg_bit_for_bit():
    protocol = {"rounds": 2, "participation": 0.5}
    prox, avg = fedprox_run(protocol, mu=0.0), fedavg_run(protocol)
    prox_reports, avg_reports = prox.run_all(), avg.run_all()
    assert np.array_equal(prox.server.state.model.encoder, avg.server.state.model.encoder)
    assert np.array_equal(prox.server.state.model.head, avg.server.state.model.head)
    for prox_round, avg_round in zip(prox_reports, avg_reports):
        assert prox_round.selected == avg_round.selected
        assert [e.result for e in prox_round.eval_reports] == [e.result for e in avg_round.eval_reports]
        losses = [(u.client_id, u.train_loss) for u in prox_round.uploads]
        assert losses == [(u.client_id, u.train_loss) for u in avg_round.uploads]


def test_a_large_mu_keeps_the_upload_closer_to_the_broadcast_model():
    distances = {}
    for mu in (0.0, 10.0):
        run = fedprox_run(protocol={"rounds": 1}, mu=mu)
        broadcast = flat(run.server.state.model)
        run.run_round(1)
        distances[mu] = [float(np.linalg.norm(flat(run.algorithm.uploads[k]) - broadcast)) for k in range(8)]
    assert all(free > 0 for free in distances[0.0])
    assert all(pulled < 0.5 * free for pulled, free in zip(distances[10.0], distances[0.0]))


def test_the_default_mu_moves_the_global_model_off_fedavgs():
    protocol = {"rounds": 1}
    prox, avg = fedprox_run(protocol), fedavg_run(protocol)
    assert prox.algorithm.params.mu == 0.01
    prox.run_all(), avg.run_all()
    assert not np.array_equal(prox.server.state.model.encoder, avg.server.state.model.encoder)


def test_runs_end_to_end_and_scores_every_client_with_the_global_model(tmp_path: Path):
    scenario = build_scenario(tiny_scenario(algorithm={"name": "fedprox"}, protocol={"rounds": 2}, runtime={"backend": "local"}))
    run_simulation(prepare_run(scenario), tmp_path / "fedprox", QuietObserver())
    clients = pq.read_table(tmp_path / "fedprox" / "clients.parquet").to_pydict()
    assert sorted(zip(clients["round"], clients["client_id"])) == [(r, k) for r in (1, 2) for k in range(8)]
    assert set(clients["reference"]) == {"global"}
    assert clients["accuracy"] == clients["accuracy_global"]
    assert all(0.0 <= a <= 1.0 for a in clients["accuracy"])
