"""A CUDA host's deterministic mode leaves out torch's NaN fill of new tensors.

`torch.use_deterministic_algorithms(True)` also fills every uninitialised tensor
with NaN, one kernel launch per allocation on a GPU (529 instead of 75 per batched
ResNet-18 step). The fill changes a result only where code reads memory it never
wrote; these tests show that nothing a run computes does: the same run, in
deterministic mode with the fill on and off, gives the same bits on the CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pyarrow.parquet as pq
import pytest
import torch

import hdcfl_ray
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.runtime.client.device import configure_cuda
from tests.conftest import tiny_scenario


@pytest.fixture
def torch_determinism_restored() -> Iterator[None]:
    """Puts back torch's process-wide settings the test changes."""
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.utils.deterministic.fill_uninitialized_memory,
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
    )
    yield
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
    torch.utils.deterministic.fill_uninitialized_memory = saved[2]
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[3], saved[4]
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[5], saved[6]


def test_a_cuda_hosts_deterministic_mode_turns_the_fill_off(torch_determinism_restored: None) -> None:
    runtime = build_scenario(tiny_scenario(runtime={"num_gpus_per_actor": 1})).runtime
    assert runtime.cuda_deterministic
    torch.utils.deterministic.fill_uninitialized_memory = True
    configure_cuda(runtime, torch.device("cuda", 0))  # sets flags only: no CUDA call is made
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.utils.deterministic.fill_uninitialized_memory is False


def _run_bits(tmp_path: Path, write_scenario, name: str, method: str) -> dict[str, list[dict]]:
    scenario = tiny_scenario(
        algorithm={"name": method},
        protocol={"rounds": 2, "participation": 1.0, "local_epochs": 1, "batch_size": 16},
        partition={"kind": "rotation", "num_clients": 6, "angles": [0, 180], "test_per_client": 30},
        runtime={"backend": "local", "num_cpus": 1, "batched_training": True},
        output={"dir": str(tmp_path / name)},
        checkpoint={"every": None},
    )
    run = hdcfl_ray.simulate(write_scenario(scenario, f"{name}.yaml"), progress=False)
    tables = {}
    for table in ("clients", "updates"):
        rows = pq.read_table(run.dir / f"{table}.parquet").to_pylist()
        tables[table] = [{key: value for key, value in row.items() if not key.endswith("_s") and "time" not in key} for row in rows]
    return tables


@pytest.mark.parametrize("method", ["hdcfl", "fedavg"])
def test_deterministic_runs_give_the_same_bits_with_and_without_the_fill(
    method: str, tmp_path: Path, write_scenario, torch_determinism_restored: None
) -> None:
    results = {}
    for fill in (True, False):
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = fill
        results[fill] = _run_bits(tmp_path, write_scenario, f"{method}-fill-{fill}", method)
    assert results[True]["updates"] and results[True] == results[False]
