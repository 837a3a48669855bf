"""`partition.num_clients: all` (natural_id's default) and `partition.sample_fraction`:
the client count found on the data, the ids LEAF's --sf rule takes, what a run records,
and the errors of a count that cannot apply."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from hdcfl_ray import seeding
from hdcfl_ray.config import load_scenario
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.data.standins.femnist import write_femnist_standin
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.terminal.live_view import QuietObserver
from tests.cli_exit import assert_refused

FEMNIST = Path(__file__).resolve().parents[1] / "scenarios" / "femnist.yaml"


def _writers_folder(root: Path, writers: int, seed: int = 3) -> Path:
    return write_femnist_standin(root / f"femnist-{writers}", writers=writers, mean_samples=80, seed=seed)  # each writer above the floor of 10


def _shipped_femnist(folder: Path, *overrides: str) -> Any:
    """The shipped FEMNIST scenario on another folder, small enough for a test run."""
    return load_scenario(
        FEMNIST,
        [
            f"dataset.path={folder}", "algorithm.name=fedavg", "protocol.rounds=1", "protocol.local_epochs=1",
            "runtime.backend=local", *overrides,
        ],
    )


@pytest.mark.parametrize("writers", [5, 24])
def test_the_shipped_femnist_scenario_takes_every_writer_without_a_count(tmp_path, writers):
    """The shipped scenario names no num_clients: a folder with N writers (each above the
    floor) gives N clients, one writer each, every writer held once."""
    scenario = _shipped_femnist(_writers_folder(tmp_path, writers))
    assert scenario.partition.num_clients == "all"
    prepared = prepare_run(scenario)
    assert prepared.scenario.partition.num_clients == writers
    assert len(prepared.partition.clients) == writers
    assert prepared.as_written.partition.num_clients == "all"
    writer_codes = [np.unique(prepared.dataset.train_ids[client.train_indices]) for client in prepared.partition.clients]
    assert all(codes.shape[0] == 1 for codes in writer_codes)
    assert sorted(int(codes[0]) for codes in writer_codes) == list(range(writers))
    assert any("num_clients: all" in notice and str(writers) in notice for notice in prepared.notices)


def test_a_run_records_all_as_written_and_the_count_it_stood_for(tmp_path):
    """The run folder keeps `all` (what a rerun compares) and the manifest the count."""
    scenario = _shipped_femnist(_writers_folder(tmp_path, 7))
    run_dir = tmp_path / "run"
    run_simulation(prepare_run(scenario), run_dir, QuietObserver())
    written = yaml.safe_load((run_dir / "scenario.yaml").read_text())
    assert written["partition"]["num_clients"] == "all"
    import json

    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["dataset"]["num_clients"] == 7
    clients = pq.read_table(run_dir / "clients.parquet").to_pydict()
    assert sorted(set(clients["client_id"])) == list(range(7))
    from analysis.final_metrics import run_client_count
    from analysis.runs import load_run

    assert run_client_count(load_run(run_dir)) == 7


def test_ids_below_the_floor_are_not_clients(tmp_path):
    folder = _writers_folder(tmp_path, 12)
    prepared = prepare_run(_shipped_femnist(folder, "partition.min_samples=40"))
    counts = np.bincount(prepared.dataset.train_ids, minlength=len(prepared.dataset.id_names))
    assert prepared.scenario.partition.num_clients == int((counts >= 40).sum())
    assert 0 < prepared.scenario.partition.num_clients < 12


@pytest.mark.parametrize("seed", [5, 77, 2026])
@pytest.mark.parametrize("fraction", [0.1, 0.35, 0.8])
def test_sample_fraction_takes_ids_in_seeded_order_until_their_samples_reach_the_share(tmp_path_factory, seed, fraction):
    """LEAF's --sf for its non-IID sample, counted independently here: ids in the seeded
    order until their samples (training and test) reach the share, the one crossing it
    included."""
    folder = _writers_folder(tmp_path_factory.mktemp("fraction"), 30)
    prepared = prepare_run(_shipped_femnist(folder, f"seed={seed}", f"partition.sample_fraction={fraction}", "partition.min_samples=1"))
    dataset = prepared.dataset
    samples = np.bincount(dataset.train_ids, minlength=len(dataset.id_names)) + np.bincount(dataset.test_ids, minlength=len(dataset.id_names))
    order = np.random.default_rng(seeding.data_streams(seed)[0]).permutation(np.arange(len(dataset.id_names)))
    taken, total = [], 0
    for code in order:
        taken.append(int(code))
        total += int(samples[code])
        if total >= fraction * samples.sum():
            break
    held = sorted(int(code) for client in prepared.partition.clients for code in np.unique(dataset.train_ids[client.train_indices]))
    assert held == sorted(taken)
    assert prepared.scenario.partition.num_clients == len(taken)


def test_two_ids_per_client_round_the_count_down_to_whole_clients(tmp_path):
    prepared = prepare_run(_shipped_femnist(_writers_folder(tmp_path, 9), "partition.ids_per_client=2", "partition.min_samples=1"))
    assert prepared.scenario.partition.num_clients == 4


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"partition": {"kind": "rotation", "num_clients": "all"}}, ["partition.num_clients", "natural_id", "count"]),
        ({"partition": {"kind": "iid", "num_clients": 10, "sample_fraction": 0.5}}, ["partition.sample_fraction", "iid"]),
        (
            {"partition": {"kind": "natural_id", "partition_by": "writer_id", "num_clients": 10, "sample_fraction": 0.5}},
            ["partition.sample_fraction", "partition.num_clients", "keep one"],
        ),
        ({"partition": {"kind": "natural_id", "partition_by": "writer_id", "sample_fraction": 1.5}}, ["sample_fraction"]),
        ({"partition": {"kind": "iid", "num_clients": 0}}, ["num_clients"]),
    ],
)
def test_counts_that_cannot_apply_are_refused_naming_the_key(changes, words):
    raw = {"name": "count", "dataset": {"name": "digits"}, "algorithm": {"name": "fedavg"}, **changes}
    with pytest.raises(ScenarioError) as refused:
        build_scenario(raw)
    for word in words:
        assert word in str(refused.value)


def test_all_on_a_source_without_ids_names_the_key(tmp_path):
    scenario = build_scenario(
        {
            "name": "no-ids", "dataset": {"name": "digits"}, "algorithm": {"name": "fedavg"},
            "partition": {"kind": "natural_id", "partition_by": "writer_id"},
        }
    )
    with pytest.raises(ScenarioError) as refused:
        prepare_run(scenario)
    assert "writer_id" in str(refused.value) or "partition" in str(refused.value)


def test_a_participation_count_above_the_ids_found_is_refused(tmp_path):
    with pytest.raises(ScenarioError) as refused:
        prepare_run(_shipped_femnist(_writers_folder(tmp_path, 5), "protocol.participation=8"))
    assert "protocol.participation" in str(refused.value) and "all = 5" in str(refused.value)


@pytest.mark.parametrize("command", ["validate", "simulate"])
def test_the_cli_refuses_all_on_a_rotation_with_exit_2(tmp_path, command):
    quickstart = yaml.safe_load((FEMNIST.parent / "quickstart.yaml").read_text())
    quickstart["partition"]["num_clients"] = "all"
    scenario = tmp_path / "quickstart-all.yaml"
    scenario.write_text(yaml.safe_dump(quickstart))
    assert_refused(command, scenario, tmp_path, ["partition.num_clients", "natural_id"])


def test_a_ceiling_on_samples_leaves_out_the_larger_ids_from_the_count_and_the_choice(tmp_path):
    """partition.max_samples: every client's writer holds between the floor and the ceiling,
    `all` counts exactly those writers, and a count draws among them only."""
    rng = np.random.default_rng()
    folder = _writers_folder(tmp_path, 12, seed=int(rng.integers(1, 1_000)))  # any folder: the rule is on its counts
    everyone = prepare_run(_shipped_femnist(folder))
    sizes = sorted(client.num_train for client in everyone.partition.clients)
    ceiling = sizes[len(sizes) // 2]  # about half the writers fit under it
    fitting = sum(size <= ceiling for size in sizes)
    capped = prepare_run(_shipped_femnist(folder, f"partition.max_samples={ceiling}"))
    assert capped.scenario.partition.num_clients == fitting
    assert all(client.num_train <= ceiling for client in capped.partition.clients)
    assert any(f"partition.max_samples ({ceiling})" in notice for notice in capped.notices)
    counted = prepare_run(_shipped_femnist(folder, f"partition.max_samples={ceiling}", f"partition.num_clients={fitting - 1}"))
    assert all(client.num_train <= ceiling for client in counted.partition.clients)


def test_a_ceiling_that_leaves_too_few_ids_or_sits_under_the_floor_is_refused(tmp_path):
    folder = _writers_folder(tmp_path, 6)
    with pytest.raises(ScenarioError, match=r"partition.max_samples \(5\) is below partition.min_samples \(10\)"):
        _shipped_femnist(folder, "partition.max_samples=5")
    with pytest.raises((ScenarioError, ValueError), match=r"raise partition.max_samples"):
        prepare_run(_shipped_femnist(folder, "partition.max_samples=10", "partition.num_clients=3"))


def test_a_ceiling_belongs_to_natural_partitions_only():
    from hdcfl_ray.config.schema import PartitionConfig

    with pytest.raises(ValueError, match="partition.max_samples caps the ids of a natural_id partition"):
        PartitionConfig(kind="iid", max_samples=100)
