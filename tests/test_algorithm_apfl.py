"""APFL: each client mixes a personal model with the global one by a learned weight
alpha. The weight moves when adaptive and stays put when not; with alpha fixed at 0
the personalised model is the global model; both passes count in the budget."""

from __future__ import annotations

import numpy as np

from hdcfl_ray.algorithms.apfl import APFL, APFLParams, mixture
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.contract import ModelParams
from hdcfl_ray.runtime.backends.local_host import in_process_run
from hdcfl_ray.runtime.driver import prepare_run
from tests.conftest import tiny_scenario


def apfl_run(protocol=None, **params):
    scenario = build_scenario(tiny_scenario(algorithm={"name": "apfl", "apfl": params}, protocol=protocol or {}))
    return in_process_run(prepare_run(scenario), algorithm=APFL(APFLParams(**params)))


def test_mixture_weights_personal_and_global_models_by_alpha():
    personal = ModelParams(np.array([1.0, 3.0], np.float32), np.array([2.0], np.float32))
    global_model = ModelParams(np.array([3.0, 1.0], np.float32), np.array([0.0], np.float32))
    mixed = mixture(personal, global_model, 0.25)
    np.testing.assert_allclose(mixed.encoder, [2.5, 1.5])
    np.testing.assert_allclose(mixed.head, [0.5])
    assert mixture(personal, global_model, 0.0).encoder.tolist() == global_model.encoder.tolist()


def test_alpha_is_learned_when_adaptive_and_fixed_when_not():
    learned = apfl_run({"rounds": 2}, alpha_init=0.5, alpha_lr=0.5).run_all()
    fixed = apfl_run({"rounds": 2}, alpha_init=0.5, adaptive=False).run_all()
    learned_alphas = [u.values["alpha"] for report in learned for u in report.uploads]
    fixed_alphas = [u.values["alpha"] for report in fixed for u in report.uploads]
    assert fixed_alphas and all(alpha == 0.5 for alpha in fixed_alphas)
    assert learned_alphas and any(alpha != 0.5 for alpha in learned_alphas)
    assert all(0.0 <= alpha <= 1.0 for alpha in learned_alphas)


def test_with_alpha_fixed_at_zero_the_personalised_model_is_the_global_model():
    reports = apfl_run({"rounds": 2}, alpha_init=0.0, adaptive=False).run_all()
    for evaluation in reports[-1].eval_reports:
        assert evaluation.result.headline == "personalized"
        assert evaluation.result.references["personalized"] == evaluation.result.references["global"]


def test_the_global_model_is_averaged_and_both_passes_count_in_the_budget():
    run = apfl_run({"rounds": 1, "local_epochs": 2})
    before = run.server.state.model
    report = run.run_all()[0]
    assert not np.array_equal(before.encoder, run.server.state.model.encoder)
    assert report.uploads and all(np.isfinite(meta.train_loss) and meta.accepted for meta in report.uploads)
    for meta in report.uploads:  # the w pass and the mixture pass, over every local epoch
        assert meta.budget.samples == 2 * 2 * meta.num_samples
        assert meta.budget.steps == 2 * meta.steps
