"""FedAvg (one global model) and Local-only, run in-process (no Ray)."""

from __future__ import annotations

import numpy as np

from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.runtime.backends.local_host import in_process_run
from hdcfl_ray.runtime.driver import prepare_run
from tests.conftest import tiny_scenario


def run_for(name: str, **changes):
    return in_process_run(prepare_run(build_scenario(tiny_scenario(algorithm={"name": name}, **changes))))


def test_fedavg_averages_encoder_and_head_and_scores_everyone_with_one_model():
    run = run_for("fedavg", protocol={"participation": 0.5})
    before = run.server.state.model
    report = run.run_round(1)
    after = run.server.state.model
    assert not np.array_equal(before.head, after.head)
    accuracies = {e.client_id: e.result.references["global"].accuracy for e in report.eval_reports}
    assert set(accuracies) == set(range(8))
    assert all(e.result.headline == "global" for e in report.eval_reports)


def test_fedavg_global_model_is_the_weighted_average_of_uploaded_models():
    from hdcfl_ray.contract import ModelParams, Upload
    from hdcfl_ray.algorithms.fedavg import FedAvg

    algorithm = FedAvg()
    state = algorithm.init_server(ModelParams(np.zeros(3, np.float32), np.zeros(2, np.float32)), [], 2)
    uploads = [
        Upload(1, 30, 0.1, 1, models={"model": ModelParams(np.array([3, 0, 0], np.float32), np.array([1, 1], np.float32))}),
        Upload(0, 10, 0.1, 1, models={"model": ModelParams(np.array([1, 2, 4], np.float32), np.array([5, 1], np.float32))}),
    ]
    algorithm.aggregate(state, 1, uploads)
    assert np.allclose(state.model.encoder, [(1 * 10 + 3 * 30) / 40, 20 / 40, 40 / 40])
    assert np.allclose(state.model.head, [(5 * 10 + 1 * 30) / 40, 1.0])


def test_local_only_models_never_leave_clients_and_diverge():
    run = run_for("local")
    report = run.run_round(1)
    models = [run.host.client_states[k].model for k in range(8)]
    assert not np.array_equal(models[0].encoder, models[1].encoder)
    assert all(e.result.headline == "local" for e in report.eval_reports)
    assert run.server.state is None
