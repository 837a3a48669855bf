"""hdcfl_ray/privacy/accountant.py: epsilon of composed Poisson-subsampled Gaussian releases
from Opacus's RDP and PRV accountants, and the noise multiplier that meets a target."""

from __future__ import annotations

import math
import sys

import pytest

from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.privacy.accountant import TARGET_TOLERANCE, epsilon, noise_for_target
from hdcfl_ray.privacy.opacus_extra import PrivacyExtraMissing
from tests.conftest import ACCOUNTANT_MISSING

DELTA = 1e-5


@pytest.fixture
def opacus() -> None:
    pytest.importorskip("opacus", reason=ACCOUNTANT_MISSING)


def test_rdp_epsilon_of_the_dp_sgd_reference_settings(opacus: None) -> None:
    assert round(epsilon([(1.0, 0.01, 1000)], DELTA), 3) == 2.101
    assert round(epsilon([(1.0, 0.1, 100)], DELTA), 3) == 7.899


@pytest.mark.parametrize("release", [(1.0, 0.01, 1000), (1.0, 0.1, 100), (0.8, 0.05, 500)])
def test_prv_estimate_is_not_above_the_rdp_guarantee(opacus: None, release: tuple[float, float, int]) -> None:
    assert epsilon([release], DELTA, "prv") <= epsilon([release], DELTA, "rdp")


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_releases_of_one_mechanism_listed_apart_compose_as_one(opacus: None, accountant: str) -> None:
    apart = epsilon([(1.0, 0.01, 600), (1.0, 0.01, 400)], DELTA, accountant)  # type: ignore[arg-type]
    assert apart == epsilon([(1.0, 0.01, 1000)], DELTA, accountant)  # type: ignore[arg-type]


def test_two_mechanisms_spend_more_than_either(opacus: None) -> None:
    model, descriptor = (1.0, 0.01, 1000), (2.0, 0.05, 20)
    both = epsilon([model, descriptor], DELTA)
    assert both > max(epsilon([model], DELTA), epsilon([descriptor], DELTA))


def test_releases_that_release_nothing_count_for_nothing(opacus: None) -> None:
    reference = epsilon([(1.0, 0.01, 1000)], DELTA)
    assert epsilon([(1.0, 0.01, 1000), (math.inf, 0.5, 10), (0.5, 0.1, 0), (0.5, 0.0, 10)], DELTA) == reference


def test_no_release_spends_nothing_and_a_noiseless_one_everything() -> None:
    assert epsilon([], DELTA) == 0.0
    assert epsilon([(1.0, 0.01, 1000), (0.0, 0.01, 1)], DELTA) == math.inf


@pytest.mark.parametrize("target", [1.0, 2.0, 4.0, 8.0])
@pytest.mark.parametrize("sample_rate, steps", [(0.01, 1000), (0.1, 100)])
def test_noise_for_target_meets_the_target_within_its_tolerance(opacus: None, target: float, sample_rate: float, steps: int) -> None:
    z = noise_for_target(target, [(1.0, sample_rate, steps)], DELTA)
    spent = epsilon([(z, sample_rate, steps)], DELTA)
    assert target - TARGET_TOLERANCE <= spent <= target


def test_noise_for_target_scales_each_release_of_a_plan(opacus: None) -> None:
    plan = [(1.0, 0.01, 1000), (2.0, 0.05, 20)]  # the descriptor release twice as noisy as the model's
    z = noise_for_target(4.0, plan, DELTA)
    spent = epsilon([(z * scale, rate, steps) for scale, rate, steps in plan], DELTA)
    assert 4.0 - TARGET_TOLERANCE <= spent <= 4.0


def test_noise_for_target_with_the_prv_estimate(opacus: None) -> None:
    z = noise_for_target(2.0, [(1.0, 0.01, 1000)], DELTA, "prv")
    assert 2.0 - TARGET_TOLERANCE <= epsilon([(z, 0.01, 1000)], DELTA, "prv") <= 2.0
    assert z < noise_for_target(2.0, [(1.0, 0.01, 1000)], DELTA, "rdp")  # the tighter estimate asks less noise


def test_an_unreachable_target_names_the_key() -> None:
    with pytest.raises(ValueError, match="privacy.target_epsilon"):
        noise_for_target(4.0, [(1.0, 0.01, 1000), (0.0, 0.01, 10)], DELTA)
    with pytest.raises(ValueError, match="privacy.target_epsilon"):
        noise_for_target(0.0, [(1.0, 0.01, 1000)], DELTA)


def test_a_plan_that_releases_nothing_needs_no_noise() -> None:
    assert noise_for_target(1.0, [(1.0, 0.01, 0)], DELTA) == 0.0


def test_without_opacus_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opacus", None)
    monkeypatch.setitem(sys.modules, "opacus.accountants", None)
    with pytest.raises(PrivacyExtraMissing, match=r"pip install 'hdcfl-ray\[dp\]'") as raised:
        epsilon([(1.0, 0.01, 1000)], DELTA)
    assert isinstance(raised.value, ImportError) and isinstance(raised.value, ScenarioError)


def test_bad_releases_are_refused_with_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="sample rate"):
        epsilon([(1.0, 1.5, 10)], DELTA)
    with pytest.raises(ValueError, match="delta"):
        epsilon([(1.0, 0.01, 10)], 0.0)
    with pytest.raises(ValueError, match="steps"):
        epsilon([(1.0, 0.01, -1)], DELTA)


@pytest.mark.parametrize("release", [(1e-3, 1.0, 30), (1e5, 0.5, 30)])
def test_an_optimal_order_at_the_edge_of_the_range_prints_nothing(opacus: None, release: tuple[float, float, int]) -> None:
    """Opacus warns when the best Renyi order is the first or last one tried; the epsilon is a
    guarantee either way and target_epsilon's search tries such multipliers on purpose: no
    run's terminal should show it."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert epsilon([release], 1e-5) > 0
