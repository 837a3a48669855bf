"""IFCA: lowest-loss assignment, averaging only within clusters, symmetry breaking."""

from __future__ import annotations

import numpy as np
import torch

from hdcfl_ray.maths.aggregate import weighted_average
from hdcfl_ray.algorithms.cluster_models import UPLOADED_MODEL
from hdcfl_ray.algorithms.ifca import (
    IFCA,
    IFCAParams,
    assignment_subset,
    choose_cluster,
)
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.config.methods import run_info
from hdcfl_ray.contract import ModelParams, Upload
from hdcfl_ray.models import build_split_model, load_flat_into
from hdcfl_ray.runtime.backends.local_host import in_process_run
from hdcfl_ray.runtime.driver import prepare_run
from tests.conftest import tiny_scenario


def ifca_run(rounds: int = 1, **ifca: int):
    prepared = prepare_run(
        build_scenario(tiny_scenario(algorithm={"name": "ifca", "ifca": {"clusters": 3, "assignment_samples": 48, **ifca}}, protocol={"rounds": rounds}))
    )
    return in_process_run(prepared, algorithm=IFCA(prepared.scenario.algorithm.ifca, run_info(prepared.scenario)))


def losses_computed_independently(run, client_id: int, models: list[ModelParams]) -> list[float]:
    """Mean cross-entropy on the client's fixed subset, through a separately built model."""
    scenario = run.host.scenario
    model = build_split_model(scenario.model, in_channels=1, num_classes=10, seed=0)
    inputs, labels = run.host.context(client_id, 1).train_data()
    subset = assignment_subset(int(labels.shape[0]), scenario.algorithm.ifca.assignment_samples, scenario.seed, client_id)
    losses = []
    for params in models:
        load_flat_into(model.encoder, params.encoder)
        load_flat_into(model.head, params.head)
        model.eval()
        with torch.no_grad():
            logits = model.head(model.encoder(inputs[subset].cpu()))
            losses.append(float(torch.nn.functional.cross_entropy(logits, labels[subset].cpu())))
    return losses


def fake_model(value: float, size: int = 5) -> ModelParams:
    return ModelParams(encoder=np.full(size, value, dtype=np.float32), head=np.full(3, -value, dtype=np.float32))


def fake_upload(client_id: int, cluster: int, model: ModelParams, num_samples: int) -> Upload:
    return Upload(client_id, num_samples, 0.0, 1, models={UPLOADED_MODEL: model}, values={"cluster": cluster})


# ---- pure rules ----


def test_ties_go_to_the_lower_index():
    assert choose_cluster([0.7, 0.2, 0.2]) == 1
    assert choose_cluster([0.5, 0.5, 0.5, 0.5]) == 0
    assert choose_cluster([0.9, 0.1]) == 1


def test_a_nan_loss_never_wins_the_assignment():
    assert choose_cluster([float("nan"), 3.0, 2.0]) == 2


def test_assignment_subset_is_fixed_per_client_and_capped():
    first = assignment_subset(200, 50, seed=7, client_id=3)
    assert np.array_equal(first, assignment_subset(200, 50, seed=7, client_id=3))
    assert first.size == 50 and np.unique(first).size == 50 and first.max() < 200
    assert not np.array_equal(first, assignment_subset(200, 50, seed=7, client_id=4))
    assert np.array_equal(assignment_subset(30, 50, seed=7, client_id=3), np.arange(30))


# ---- server aggregation ----


def test_a_cluster_model_is_the_weighted_average_of_its_members_and_an_empty_cluster_is_unchanged():
    scenario = build_scenario(tiny_scenario(algorithm={"name": "ifca"}))
    ifca = IFCA(IFCAParams(clusters=3), run_info(scenario))
    initial = [fake_model(10.0), fake_model(20.0), fake_model(30.0)]
    state = ifca.init_server(initial[0], initial, num_clients=4)
    uploads = [
        fake_upload(0, cluster=0, model=fake_model(1.0), num_samples=10),
        fake_upload(1, cluster=2, model=fake_model(5.0), num_samples=7),
        fake_upload(2, cluster=0, model=fake_model(4.0), num_samples=30),
    ]
    notes = ifca.aggregate(state, 2, uploads)

    expected_zero = weighted_average([fake_model(1.0).encoder, fake_model(4.0).encoder], [10, 30])
    assert np.array_equal(state.models[0].encoder, expected_zero)
    assert np.array_equal(state.models[0].head, weighted_average([fake_model(1.0).head, fake_model(4.0).head], [10, 30]))
    assert np.array_equal(state.models[1].encoder, initial[1].encoder)  # no members: untouched
    assert np.array_equal(state.models[1].head, initial[1].head)
    assert np.array_equal(state.models[2].encoder, fake_model(5.0).encoder)  # one member: its model
    assert any("cluster sizes [2, 0, 1]" in event for event in notes.events)
    assert any("cluster 1 had no members" in event for event in notes.events)


def test_an_empty_cluster_is_reported_with_how_long_it_has_been_empty():
    scenario = build_scenario(tiny_scenario(algorithm={"name": "ifca"}))
    ifca = IFCA(IFCAParams(clusters=2), run_info(scenario))
    state = ifca.init_server(fake_model(0.0), [fake_model(1.0), fake_model(2.0)], num_clients=1)
    ifca.aggregate(state, 1, [fake_upload(0, 0, fake_model(3.0), 5)])
    notes = ifca.aggregate(state, 2, [fake_upload(0, 0, fake_model(3.0), 5)])
    assert any("cluster 1 had no members" in event and "2 round(s) since round 1" in event for event in notes.events)


# ---- in-process rounds ----


def test_each_client_trains_the_cluster_model_of_lowest_loss_and_is_evaluated_with_the_recomputed_choice():
    run = ifca_run(rounds=1)
    models_before = list(run.server.state.models)
    report = run.run_round(1)

    assert any("3 cluster models from 3 independent initialisations" in event for event in report.events)
    chosen_by_client = {meta.client_id: meta.values["cluster"] for meta in report.uploads}
    assert sorted(chosen_by_client) == list(range(8))
    for client_id, chosen in chosen_by_client.items():
        losses = losses_computed_independently(run, client_id, models_before)
        assert len(set(np.round(losses, 6))) == 3, "independent initialisations must not tie"
        assert chosen == int(np.argmin(losses))

    # evaluation re-runs the assignment with the aggregated models, for every client
    models_after = run.server.state.models
    assert [r.client_id for r in report.eval_reports] == list(range(8))
    for evaluation in report.eval_reports:
        assert evaluation.result.headline == "personalized"
        assert evaluation.result.group == int(np.argmin(losses_computed_independently(run, evaluation.client_id, models_after)))


def test_same_scenario_twice_gives_identical_models_and_scores():
    def outcome():
        run = ifca_run(rounds=2)
        reports = run.run_all()
        scores = [(r.client_id, r.result.group, r.result.references["personalized"]) for r in reports[-1].eval_reports]
        return run.server.state.models, scores, [m.values["cluster"] for m in reports[-1].uploads]

    first_models, first_scores, first_choices = outcome()
    second_models, second_scores, second_choices = outcome()
    assert first_scores == second_scores and first_choices == second_choices
    for first, second in zip(first_models, second_models):
        assert np.array_equal(first.encoder, second.encoder) and np.array_equal(first.head, second.head)
