"""Calibration without the answer key: a validation split held out of each client's
training images, and `hdcfl-ray calibrate` choosing on it by default."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hdcfl_ray.config.schema import PartitionConfig
from hdcfl_ray.data.partitions.build import build_partition
from hdcfl_ray.errors import ScenarioError
from tests.conftest import tiny_scenario


def balanced_labels(per_class: int, num_classes: int = 10) -> np.ndarray:
    return np.repeat(np.arange(num_classes), per_class)


def test_the_validation_split_is_held_out_of_each_clients_own_training_images():
    train_labels, test_labels = balanced_labels(60), balanced_labels(10)
    config = PartitionConfig(kind="label_subset", k=3, num_clients=10)
    plain = build_partition(config, train_labels, test_labels, 10, seed=4)
    held = build_partition(config.model_copy(update={"validation_fraction": 0.25}), train_labels, test_labels, 10, seed=4)
    for before, after in zip(plain.clients, held.clients):
        assert after.test_from_train and not before.test_from_train
        assert np.intersect1d(after.train_indices, after.test_indices).size == 0
        # together they are exactly the client's training images, so no test image is ever read
        assert np.array_equal(np.union1d(after.train_indices, after.test_indices), before.train_indices)
        assert after.test_indices.size == round(0.25 * before.train_indices.size)
        # per class: the held-out share follows the client's classes, and every class keeps training images
        assert set(train_labels[after.test_indices]) <= set(train_labels[before.train_indices])
        assert set(train_labels[after.train_indices]) == set(train_labels[before.train_indices])


def test_the_validation_split_is_fixed_by_the_seed_and_changes_with_it():
    train_labels, test_labels = balanced_labels(40), balanced_labels(10)
    config = PartitionConfig(kind="iid", num_clients=5, validation_fraction=0.2)
    first = build_partition(config, train_labels, test_labels, 10, seed=11)
    again = build_partition(config, train_labels, test_labels, 10, seed=11)
    other = build_partition(config, train_labels, test_labels, 10, seed=12)
    assert all(np.array_equal(a.test_indices, b.test_indices) for a, b in zip(first.clients, again.clients))
    assert any(not np.array_equal(a.test_indices, b.test_indices) for a, b in zip(first.clients, other.clients))


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), draw=st.integers(1, 5))
def test_another_draw_holds_out_other_images_of_the_same_clients_and_leaves_the_first_draw_as_it_was(seed: int, draw: int):
    train_labels, test_labels = balanced_labels(40), balanced_labels(10)
    config = PartitionConfig(kind="dirichlet", alpha=0.5, num_clients=5, validation_fraction=0.2)
    first = build_partition(config, train_labels, test_labels, 10, seed=seed)
    named = build_partition(config.model_copy(update={"validation_draw": 0}), train_labels, test_labels, 10, seed=seed)
    other = build_partition(config.model_copy(update={"validation_draw": draw}), train_labels, test_labels, 10, seed=seed)
    assert all(np.array_equal(a.test_indices, b.test_indices) for a, b in zip(first.clients, named.clients))
    for a, b in zip(first.clients, other.clients):
        # the same client's images, split otherwise, with the same class counts held out
        assert np.array_equal(np.union1d(a.train_indices, a.test_indices), np.union1d(b.train_indices, b.test_indices))
        assert np.array_equal(np.bincount(train_labels[a.test_indices], minlength=10), np.bincount(train_labels[b.test_indices], minlength=10))
    assert any(not np.array_equal(a.test_indices, b.test_indices) for a, b in zip(first.clients, other.clients))


@settings(max_examples=25, deadline=None)
@given(fraction=st.floats(0.05, 0.6), per_class=st.integers(3, 30), clients=st.integers(1, 8))
def test_the_held_out_share_never_takes_a_class_s_last_training_image(fraction, per_class, clients):
    labels = balanced_labels(per_class, num_classes=4)
    config = PartitionConfig(kind="iid", num_clients=clients, validation_fraction=fraction)
    try:
        partition = build_partition(config, labels, balanced_labels(2, num_classes=4), 4, seed=0)
    except ScenarioError as error:  # a client too small to hold anything out is named
        assert "partition.validation_fraction" in str(error)
        return
    for client in partition.clients:
        assert client.train_indices.size >= 1 and client.test_indices.size >= 1
        assert set(labels[client.train_indices]) >= set(labels[client.test_indices])


def test_a_client_with_one_image_per_class_cannot_hold_any_out():
    labels = np.arange(10)
    config = PartitionConfig(kind="iid", num_clients=1, validation_fraction=0.3)
    with pytest.raises(ScenarioError, match="partition.validation_fraction: client 0"):
        build_partition(config, labels, labels, 10, seed=0)


@pytest.mark.slow  # a long end-to-end run: the slow tier (.ci/run runs it after the README's command)
def test_calibrate_chooses_on_held_out_training_images_by_default(write_scenario, tmp_path):
    from typer.testing import CliRunner

    from cli import app

    path = write_scenario(tiny_scenario(algorithm={"name": "fedprox"}, protocol={"rounds": 2}))
    report = tmp_path / "calibration.md"
    result = CliRunner().invoke(
        app,
        ["calibrate", str(path), "--key", "algorithm.fedprox.mu", "--values", "0.01,1", "--seeds", "3",
         "--out", str(tmp_path / "calib"), "--report", str(report)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    manifests = [json.loads(p.read_text()) for p in (tmp_path / "calib").rglob("manifest.json")]
    assert len(manifests) == 2 and all(m["dataset"]["scored_on"] == "validation" for m in manifests)
    text = report.read_text()
    assert "Mean acc. (validation)" in text and "ARI vs planted (oracle)" in text
    assert "Chosen: algorithm.fedprox.mu = " in text


def test_calibrate_with_oracle_scores_on_the_test_set_and_chooses_nothing(write_scenario, tmp_path):
    from typer.testing import CliRunner

    from cli import app

    path = write_scenario(tiny_scenario(algorithm={"name": "fedprox"}, protocol={"rounds": 1}))
    report = tmp_path / "calibration.md"
    result = CliRunner().invoke(
        app,
        ["calibrate", str(path), "--key", "algorithm.fedprox.mu", "--values", "0.01", "--seeds", "3", "--oracle",
         "--out", str(tmp_path / "calib"), "--report", str(report)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    text = report.read_text()
    assert "test (oracle)" in text and "No value chosen" in text and "Chosen:" not in text
    [manifest] = [json.loads(p.read_text()) for p in (tmp_path / "calib").rglob("manifest.json")]
    assert manifest["dataset"]["scored_on"] == "test"


def test_the_rule_picks_the_best_mean_validation_accuracy_and_breaks_ties_towards_the_smaller_value():
    from analysis.calibration_table import choose_value

    class FakeRun:
        status = "completed"
        scored_on_validation = True

        def __init__(self, value: float, accuracy: float) -> None:
            self.scenario = tiny_scenario(algorithm={"name": "fedprox", "fedprox": {"mu": value}}, partition={"validation_fraction": 0.2})
            self.accuracy = accuracy

        def final_evaluated_round(self):
            return {"mean_accuracy": self.accuracy}

    runs = [FakeRun(1.0, 0.5), FakeRun(1.0, 0.7), FakeRun(0.1, 0.6), FakeRun(0.1, 0.6), FakeRun(0.01, 0.2)]
    assert choose_value(runs, "algorithm.fedprox.mu").value == "0.1"  # 0.6 = 0.6: the smaller value
    runs[0].accuracy = 0.51
    assert choose_value(runs, "algorithm.fedprox.mu").value == "1.0"


@pytest.mark.slow  # a long end-to-end run: the slow tier (.ci/run runs it after the README's command)
def test_calibrate_over_runs_made_with_other_settings_exits_2_and_names_the_key(write_scenario, tmp_path):
    from typer.testing import CliRunner

    from cli import app

    path = write_scenario(tiny_scenario(algorithm={"name": "fedprox"}, protocol={"rounds": 1}))
    command = ["calibrate", str(path), "--key", "algorithm.fedprox.mu", "--values", "0.01", "--seeds", "3", "--out", str(tmp_path / "calib")]
    assert CliRunner().invoke(app, command).exit_code == 0
    changed = CliRunner().invoke(app, [*command, "--set", "protocol.optimizer.lr=0.2"])
    assert changed.exit_code == 2, changed.output
    assert "protocol.optimizer.lr" in changed.output and "Traceback" not in changed.output
    replaced = CliRunner().invoke(app, [*command, "--set", "protocol.optimizer.lr=0.2", "--replace-changed"])
    assert replaced.exit_code == 0, replaced.output


def test_no_value_is_chosen_while_a_run_is_unfinished():
    from pathlib import Path

    from analysis.calibration_table import calibration_table, choose_value

    class FakeRun:
        scored_on_validation = True

        def __init__(self, value: float, accuracy: float, status: str) -> None:
            self.scenario = tiny_scenario(algorithm={"name": "fedprox", "fedprox": {"mu": value}}, partition={"validation_fraction": 0.2})
            self.accuracy, self.status = accuracy, status
            self.run_dir = Path(f"out/setting.mu-{value}/fedprox/seed42")
            self.method, self.seed = "fedprox", 42
            self.rounds = __import__("pyarrow").table({"samples_trained": [1], "eval_samples_trained": [0]})
            self.manifest = {"git_revision": "0123456789abcdef", "hardware": {"cpu_model": "Test CPU"},
                             "packages": {"torch": "2.14.1", "ray": "2.60.0"}}

        def final_evaluated_round(self):
            return {"mean_accuracy": self.accuracy} if self.status == "completed" else None

    runs = [FakeRun(0.01, 0.5, "completed"), FakeRun(1.0, 0.9, "failed")]
    assert choose_value(runs, "algorithm.fedprox.mu").value is None
    note = calibration_table(runs, "algorithm.fedprox.mu").note
    assert "No value chosen yet: 1 run(s) not finished: setting.mu-1.0 (failed)" in note
    # which code and machine made the numbers, from the finished runs' manifests
    assert "Made from 1 run: commit 0123456789; on Test CPU; torch 2.14.1; Ray 2.60.0." in note
