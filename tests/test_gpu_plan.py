"""The host layout follows the device: on a machine with many cores and CUDA devices
(mocked here: this machine has no GPU), the local backend makes one host per GPU (or per
share of one the user asked for) instead of one per core, so a round's participants on
a device train as one batched group; the Ray backend packs hosts by their GPU share. The
CPU plan is unchanged. The run's updates table records which clients trained together.
The paper's scenarios, the table-3 command and the GPU check's runs lay one GPU out as one
host, so a sampled round's participants train as one batched group on either backend; the
shared layout the GPU check measures beside it (four hosts at 0.25 GPU) splits the round."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.runtime.backends.placement import assign_clients, count_hosts, local_host_devices
from hdcfl_ray.runtime.server.sampling import select_clients
from tests.conftest import tiny_scenario

CORES = 16


def _runtime(**keys: object):
    return build_scenario(tiny_scenario(runtime=keys)).runtime


def _groups_per_round(devices: list, num_clients: int, per_round: int, seed: int, rounds: int) -> list[list[list[int]]]:
    """Per round, the participants of each host: the groups that train batched."""
    hosts = assign_clients(num_clients, len(devices))
    groups = []
    for round_index in range(1, rounds + 1):
        chosen = select_clients(num_clients, per_round, seed, round_index)
        by_host: dict[int, list[int]] = {}
        for client in chosen:
            by_host.setdefault(hosts[client], []).append(client)
        groups.append([by_host[host] for host in sorted(by_host)])
    return groups


@pytest.fixture
def many_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: CORES)


@pytest.mark.parametrize("seed", [3, 41, 2026])
def test_one_gpu_and_16_cores_put_every_participant_of_a_round_in_one_batched_group(many_cores: None, seed: int) -> None:
    devices = local_host_devices(_runtime(backend="local", num_gpus_per_actor=1), 20, cuda_devices=1)
    assert devices == [0]
    for groups in _groups_per_round(devices, 20, 10, seed, rounds=5):
        assert len(groups) == 1 and len(groups[0]) == 10


def test_two_gpus_make_one_group_per_device(many_cores: None) -> None:
    devices = local_host_devices(_runtime(backend="local", num_gpus_per_actor=1), 20, cuda_devices=2)
    assert devices == [0, 1]
    for groups in _groups_per_round(devices, 20, 10, 7, rounds=5):
        assert len(groups) <= 2 and sum(map(len, groups)) == 10


def test_a_share_of_a_gpu_asked_for_makes_that_many_hosts_per_gpu(many_cores: None) -> None:
    assert local_host_devices(_runtime(backend="local", num_gpus_per_actor=0.5), 20, cuda_devices=2) == [0, 0, 1, 1]
    assert local_host_devices(_runtime(backend="local", num_gpus_per_actor=2), 20, cuda_devices=4) == [0, 2]
    assert local_host_devices(_runtime(backend="local", num_gpus_per_actor=1, max_actors=1), 20, cuda_devices=2) == [0]
    assert local_host_devices(_runtime(backend="local", num_gpus_per_actor=1), 1, cuda_devices=2) == [0]  # one client


def test_the_cpu_plan_is_one_host_per_core_as_before(many_cores: None) -> None:
    assert local_host_devices(_runtime(backend="local"), 20) == [None] * CORES
    assert local_host_devices(_runtime(backend="local", num_cpus=2), 20) == [None, None]


def test_the_ray_backend_packs_hosts_by_their_gpu_share() -> None:
    assert count_hosts(_runtime(backend="ray", num_gpus_per_actor=1), 20, CORES, 1) == 1
    assert count_hosts(_runtime(backend="ray", num_gpus_per_actor=1), 20, CORES, 2) == 2
    assert count_hosts(_runtime(backend="ray", num_gpus_per_actor=0.25), 20, CORES, 1) == 4


def test_a_run_on_two_mocked_gpus_trains_each_devices_participants_together(
    many_cores: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The local backend on two mocked CUDA devices (the hosts compute on the CPU here):
    two hosts, and each round's participants on a host train as one batched group; the
    updates table says so and the manifest records the layout."""
    import hdcfl_ray
    from hdcfl_ray.runtime.client import device

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(device, "choose_device", lambda runtime, granted=None, cuda_available=None, index=0: torch.device("cpu"))
    monkeypatch.setattr(device, "configure_cuda", lambda runtime, chosen: None)
    scenario = tiny_scenario(
        algorithm={"name": "fedavg"},
        protocol={"rounds": 2, "participation": 0.5},
        # batched as a CUDA host would be (the hosts themselves compute on the CPU here)
        runtime={"backend": "local", "num_gpus_per_actor": 1, "precision": "fp32", "batched_training": True},
    )
    run = hdcfl_ray.simulate(scenario, out=tmp_path / "run", progress=False)
    assert run.manifest["host_layout"] == {"hosts": 2, "clients": [[[0, 3]], [[4, 7]]], "batched_training": True}
    updates = pq.read_table(run.dir / "updates.parquet").to_pylist()
    for round_index in (1, 2):
        rows = [row for row in updates if row["round"] == round_index]
        for host in (0, 1):
            together = [row for row in rows if row["host"] == host]
            assert all(row["trained_together"] == len(together) for row in together), (round_index, host, together)
        assert sum(row["trained_together"] > 1 for row in rows) >= 2


# ---- the paper's scenarios and commands: one host per GPU, the round batched whole ---------

REPO = Path(__file__).resolve().parents[1]
PAPER_FILES = sorted(path for path in (REPO / "scenarios/paper").glob("*.yaml") if not path.name.startswith("sweep"))
SEEDS = [5, 123, 4097]  # sampling seeds, set on each scenario as its `seed`
ROUNDS = 8


@pytest.fixture
def paper_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The environment variables the paper scenarios read, pointed into tmp_path (nothing is read)."""
    for name in ("HDCFL_CIFAR10", "HDCFL_CIFAR100", "HDCFL_RESNET18_IMAGENET", "HDCFL_MOBILENETV2_IMAGENET"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    return tmp_path


def _layouts(scenario) -> dict[str, list]:
    """The hosts each backend makes on one mocked GPU and 16 cores, as a device list per host."""
    runtime, clients = scenario.runtime, scenario.partition.num_clients
    return {"local": local_host_devices(runtime, clients, cuda_devices=1),
            "ray": [0] * count_hosts(runtime, clients, available_cpus=CORES, available_gpus=1)}


def _assert_round_batched_whole(scenario) -> None:
    """On one GPU, both backends give one host, and every sampled round's participants
    land on it together: one group of the round's full size, trained batched."""
    from hdcfl_ray.config.runtime_resolved import trains_batched

    assert trains_batched(scenario.runtime), scenario.name
    clients, per_round = scenario.partition.num_clients, scenario.clients_per_round()
    for backend, devices in _layouts(scenario).items():
        assert len(devices) == 1, (scenario.name, backend, devices)
        for groups in _groups_per_round(devices, clients, per_round, scenario.seed, rounds=ROUNDS):
            assert [len(group) for group in groups] == [per_round], (scenario.name, backend, groups)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("path", PAPER_FILES, ids=lambda path: path.stem)
def test_every_paper_scenario_batches_its_whole_round_on_one_gpu(many_cores: None, paper_data: Path, path: Path, seed: int) -> None:
    from hdcfl_ray.config.loading import load_scenario

    scenario = load_scenario(path, [f"seed={seed}"])
    assert scenario.clients_per_round() == 10 and scenario.runtime.num_gpus_per_actor == 1
    _assert_round_batched_whole(scenario)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_table3_command_batches_its_whole_round_on_one_gpu(many_cores: None, paper_data: Path, seed: int) -> None:
    from hdcfl_ray.config.loading import load_scenario
    from tests.script_modules import load_script

    table3 = load_script(REPO / "scenarios/paper/table3.py", "table3_script")
    scenario = load_scenario(table3.SCENARIO, [*table3.RUN_SETS, f"dataset.path={paper_data}", f"seed={seed}"])
    assert scenario.runtime.backend == "local"
    _assert_round_batched_whole(scenario)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_gpu_checks_runs_batch_their_whole_round_and_measure_the_shared_layout_beside(
    many_cores: None, paper_data: Path, tmp_path: Path, seed: int
) -> None:
    """bit_identity's quickstart runs, paper_rot_two_rounds' default layout and paper_round's
    default plan: one host. The shared layout paper_rot_two_rounds and paper_round measure
    against it: four hosts on the GPU, the round's participants split among them."""
    from benchmarks import gpu_check, gpu_round
    from hdcfl_ray.api import resolve_scenario
    from hdcfl_ray.config.loading import load_scenario

    paper_sets = [*gpu_check.paper_overrides(str(paper_data)), f"seed={seed}"]
    keys, arithmetic = gpu_round.MODES[gpu_round.DEFAULT_MODE]
    plan = gpu_round.overrides(gpu_round.paper_sizes(2500), {**keys, **arithmetic.runtime(), "backend": "auto"}, tmp_path, gpu=True)
    whole = {
        "bit_identity": load_scenario(REPO / gpu_check.QUICKSTART, [*gpu_check.QUICK_OVERRIDES, f"seed={seed}"]),
        "paper_rot_two_rounds": load_scenario(REPO / gpu_check.PAPER, [*paper_sets, *gpu_check.PAPER_LAYOUTS["one_host_per_gpu"]]),
        "paper_round default plan": resolve_scenario(gpu_round.PAPER, {**plan, "seed": seed}),
    }
    for scenario in whole.values():
        _assert_round_batched_whole(scenario)
    shared = load_scenario(REPO / gpu_check.PAPER, [*paper_sets, *gpu_check.PAPER_LAYOUTS["four_hosts_per_gpu"]])
    ray_four = {**keys, **arithmetic.runtime(), **gpu_round.ray_hosts_sharing_the_gpu(4, 20)}
    shared_round = resolve_scenario(gpu_round.PAPER, {**gpu_round.overrides(gpu_round.paper_sizes(2500), ray_four, tmp_path, gpu=True), "seed": seed})
    for scenario in (shared, shared_round):
        hosts = count_hosts(scenario.runtime, scenario.partition.num_clients, CORES, 1)
        assert hosts == 4 and local_host_devices(scenario.runtime, scenario.partition.num_clients, cuda_devices=1) == [0] * 4
        groups = _groups_per_round([0] * hosts, scenario.partition.num_clients, scenario.clients_per_round(), scenario.seed, ROUNDS)
        assert all(sum(map(len, round_groups)) == 10 for round_groups in groups)
        assert any(len(round_groups) > 1 for round_groups in groups)  # the round split among hosts
