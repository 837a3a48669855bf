"""FedAvg-SE and HDC-FL hooks, run in-process (no Ray)."""

from __future__ import annotations

import numpy as np
import pytest

from hdcfl_ray.maths.aggregate import weighted_average
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.runtime.backends.local_host import in_process_run
from hdcfl_ray.runtime.driver import prepare_run
from tests.conftest import slow_beyond, tiny_scenario


def prepared(**changes):
    return prepare_run(build_scenario(tiny_scenario(**changes)))


def test_fedavg_se_global_encoder_is_the_sample_weighted_average_of_uploads():
    run = in_process_run(prepared(algorithm={"name": "fedavg_se"}, protocol={"participation": 0.5}))
    report = run.run_round(1)
    state = run.server.state
    uploads = sorted(report.uploads, key=lambda u: u.client_id)
    encoders = [state.cache[u.client_id].encoder for u in uploads]
    expected = weighted_average(encoders, [u.num_samples for u in uploads])
    assert np.array_equal(state.global_encoder, expected)
    assert sorted(state.cache) == report.selected


def test_fedavg_se_heads_stay_private_and_differ_after_training():
    run = in_process_run(prepared(algorithm={"name": "fedavg_se"}))
    run.run_round(1)
    heads = [run.host.client_states[k].head for k in range(8)]
    assert not np.array_equal(heads[0], heads[1])
    # the server cache holds the uploaded heads, equal to the clients' own
    for client_id, head in enumerate(heads):
        assert np.array_equal(run.server.state.cache[client_id].head, head)


def test_hdcfl_mix_zero_scores_exactly_like_the_global_encoder():
    run = in_process_run(prepared(algorithm={"name": "hdcfl", "hdcfl": {"groups": 2, "activation_round": 1, "refresh_every": 1, "mix": 0.0}}))
    report = run.run_round(1)
    for evaluation in report.eval_reports:
        refs = evaluation.result.references
        assert refs["personalized"] == refs["global"]


def test_hdcfl_refresh_recovers_planted_rotation_groups_after_a_few_rounds():
    run = in_process_run(
        prepared(
            partition={"num_clients": 8, "angles": [0, 180]},
            protocol={"rounds": 4, "local_epochs": 2, "batch_size": 16},
            algorithm={"name": "hdcfl", "hdcfl": {"groups": 2, "activation_round": 4, "refresh_every": 1}},
        )
    )
    reports = run.run_all()
    labels = reports[-1].notes.refresh.group_labels
    truth = {k: k % 2 for k in range(8)}
    same_group = {(a, b): labels[a] == labels[b] for a in range(8) for b in range(8)}
    assert all(same_group[(a, b)] == (truth[a] == truth[b]) for a in range(8) for b in range(8))


@pytest.mark.parametrize("method", slow_beyond(["fedavg_se", "hdcfl"], fast={"hdcfl"}))
def test_the_local_reference_can_be_skipped_without_touching_the_other_scores(tmp_path, method):
    from hdcfl_ray.logs.table_writer import read_table
    from hdcfl_ray.runtime.driver import prepare_run, run_simulation
    from hdcfl_ray.terminal.live_view import QuietObserver

    algorithm = {"name": method, "hdcfl": {"groups": 2, "activation_round": 1, "refresh_every": 1}}
    tables = {}
    for wanted in (True, False):
        scenario = build_scenario(tiny_scenario(algorithm=algorithm, protocol={"rounds": 2, "eval_local_reference": wanted}))
        run_simulation(prepare_run(scenario), tmp_path / str(wanted), QuietObserver())
        tables[wanted] = read_table(tmp_path / str(wanted), "clients").to_pydict()
    assert any(value is not None for value in tables[True]["accuracy_local"])
    assert all(value is None for value in tables[False]["accuracy_local"])
    for column in ("accuracy", "accuracy_global", "accuracy_personalized", "train_loss"):
        assert tables[True][column] == tables[False][column]
