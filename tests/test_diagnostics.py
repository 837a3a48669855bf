"""Diagnostics as a spec: silhouette, ARI, membership entropy, personalisation
gain and the client-accuracy fairness summary."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hdcfl_ray.diagnostics.clustering import (
    adjusted_rand,
    ari_between_refreshes,
    membership_entropy,
    personalisation_gain,
    silhouette,
)
from hdcfl_ray.diagnostics.fairness import client_accuracy_summary


def test_uniform_memberships_have_entropy_log_g() -> None:
    mean_entropy, normalised = membership_entropy(np.full((5, 4), 0.25))
    assert mean_entropy == pytest.approx(math.log(4))
    assert normalised == pytest.approx(1.0)


def test_one_hot_memberships_have_zero_entropy() -> None:
    assert membership_entropy(np.eye(3)[[0, 2, 1, 1]]) == (0.0, 0.0)


def test_a_single_group_has_zero_entropy_and_zero_normalised_entropy() -> None:
    assert membership_entropy(np.ones((3, 1))) == (0.0, 0.0)


def test_entropy_is_the_mean_over_clients() -> None:
    mean_entropy, normalised = membership_entropy(np.array([[0.5, 0.5], [1.0, 0.0]]))
    assert mean_entropy == pytest.approx(math.log(2) / 2)
    assert normalised == pytest.approx(0.5)


def test_personalisation_gain_in_points_ignores_unscored_clients() -> None:
    personalised = np.array([0.80, 0.60, 0.90, np.nan])
    global_ = np.array([0.70, 0.60, 0.95, 0.50])
    mean_gain, positive_fraction = personalisation_gain(personalised, global_)
    # gains 10, 0 and -5 points: mean 5/3; only the first is positive
    assert mean_gain == pytest.approx(5 / 3)
    assert positive_fraction == pytest.approx(1 / 3)


def test_personalisation_gain_of_nothing_is_nan() -> None:
    assert all(math.isnan(value) for value in personalisation_gain(np.array([np.nan]), np.array([0.5])))


def test_personalisation_gain_rejects_percentages() -> None:
    with pytest.raises(ValueError, match="fractions"):
        personalisation_gain(np.array([80.0]), np.array([0.7]))


def test_silhouette_is_high_for_separated_groups_and_nan_when_undefined() -> None:
    points = np.array([[0.0, 0.0], [0.0, 0.1], [5.0, 5.0], [5.0, 5.1]])
    assert silhouette(points, np.array([0, 0, 1, 1])) > 0.9
    assert math.isnan(silhouette(points, np.array([0, 0, 0, 0])))
    assert math.isnan(silhouette(points, np.array([0, 1, 2, 3])))


def test_adjusted_rand_ignores_label_names() -> None:
    assert adjusted_rand(np.array([0, 0, 1, 1, 2]), np.array([7, 7, 3, 3, 5])) == 1.0


def test_ari_between_refreshes_uses_clients_present_in_both() -> None:
    previous = {0: 0, 1: 0, 2: 1, 3: 1, 9: 2}
    current = {0: 1, 1: 1, 2: 0, 3: 0, 7: 3}
    assert ari_between_refreshes(previous, current) == 1.0
    assert ari_between_refreshes({0: 0, 1: 0, 2: 1, 3: 1}, {0: 0, 1: 1, 2: 0, 3: 1}) < 0


def test_ari_between_refreshes_needs_two_common_clients() -> None:
    assert math.isnan(ari_between_refreshes({0: 0, 1: 1}, {1: 0, 2: 1}))


def test_fairness_summary_of_ten_clients() -> None:
    accuracies = np.array([0.9, 0.8, 0.1, 0.7, 0.3, 0.6, 0.5, 0.95, 0.4, 0.65])
    summary = client_accuracy_summary(accuracies)
    assert summary["mean"] == pytest.approx(0.59)
    assert summary["worst"] == pytest.approx(0.1)
    assert summary["bottom20"] == pytest.approx(0.2)  # mean of the 2 lowest: 0.1 and 0.3
    assert summary["best"] == pytest.approx(0.95)
    assert summary["gap"] == pytest.approx(0.85)


def test_fairness_bottom20_rounds_up_and_keeps_at_least_one_client() -> None:
    assert client_accuracy_summary(np.array([0.4, 0.2, 0.9]))["bottom20"] == pytest.approx(0.2)
    eleven = np.array([0.1, 0.2, 0.3] + [0.9] * 8)
    assert client_accuracy_summary(eleven)["bottom20"] == pytest.approx(0.2)  # ceil(11/5) = 3


def test_fairness_summary_ignores_nan_clients() -> None:
    summary = client_accuracy_summary(np.array([0.5, np.nan, 0.7]))
    assert summary["mean"] == pytest.approx(0.6) and summary["worst"] == pytest.approx(0.5)
    assert all(math.isnan(value) for value in client_accuracy_summary(np.array([np.nan])).values())
