"""`partition.test_set: whole_split` scores every client on the whole test split, so a
shared model's score is its accuracy on the split (NIID-Bench's measure); the train
split and the default test sets do not move."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import hdcfl_ray
from cli import app
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.data.partitions.build import build_partition
from tests.conftest import tiny_scenario

runner = CliRunner()


@pytest.mark.parametrize("seed", [0, 17, 2026])
def test_every_client_gets_the_whole_split_and_the_same_training_images(seed: int) -> None:
    rng = np.random.default_rng(seed)
    train, test = rng.integers(0, 10, 600), rng.integers(0, 10, 250)
    sections = {"kind": "dirichlet", "num_clients": 7, "alpha": 0.5, "test_per_client": None}
    own = build_scenario(tiny_scenario(partition=sections)).partition
    whole = build_scenario(tiny_scenario(partition={**sections, "test_set": "whole_split"})).partition
    by_class = build_partition(own, train, test, 10, seed)
    everything = build_partition(whole, train, test, 10, seed)
    for a, b in zip(by_class.clients, everything.clients):
        assert np.array_equal(a.train_indices, b.train_indices)
        assert np.array_equal(b.test_indices, np.arange(250))
        assert a.test_indices.shape[0] < 250
    assert by_class.test_drawn_by_class and not everything.test_drawn_by_class


def test_a_shared_model_scores_the_same_for_every_client(tmp_path: Path, write_scenario) -> None:
    scenario = tiny_scenario(
        algorithm={"name": "fedavg"},
        partition={"kind": "dirichlet", "num_clients": 5, "alpha": 0.5, "test_set": "whole_split", "test_per_client": None},
        protocol={"rounds": 2, "participation": 1.0, "local_epochs": 1, "batch_size": 32},
        runtime={"backend": "local", "num_cpus": 1},
        output={"dir": str(tmp_path / "run")},
        checkpoint={"every": None},
    )
    run = hdcfl_ray.simulate(write_scenario(scenario), progress=False)
    rows = pq.read_table(run.dir / "clients.parquet").to_pylist()
    for round_index in {row["round"] for row in rows}:
        scores = {(row["accuracy"], row["loss"]) for row in rows if row["round"] == round_index}
        assert len(scores) == 1, (round_index, scores)


@pytest.mark.parametrize(
    ("partition", "fragment"),
    [
        ({"kind": "dirichlet", "alpha": 0.5, "test_set": "whole_split", "test_per_client": 30}, "remove test_per_client"),
        ({"kind": "dirichlet", "alpha": 0.5, "test_set": "all"}, "partition.test_set"),
    ],
)
def test_bad_test_set_settings_exit_2_naming_the_key(write_scenario, partition: dict, fragment: str) -> None:
    scenario = tiny_scenario()
    scenario["partition"] = {"num_clients": 5, **partition}
    result = runner.invoke(app, ["validate", str(write_scenario(scenario))])
    assert result.exit_code == 2, result.output
    assert fragment in result.output
