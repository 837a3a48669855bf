"""Runs of `hdcfl-ray simulate` in a fresh process whose environment imitates another
machine: capping the instruction sets the math libraries may use from outside
(oneDNN, MKL, ATen, OpenBLAS, numpy) and the thread counts, as a CPU without AMX,
without AVX512 or with more cores would. Used by tests/test_portable_bits.py.

A fresh process per run: the libraries read these variables when they load."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]

# Each imitates a machine from outside. The default mode computes differently under
# several of them (the tests show it); a portable run must not.
MACHINES: dict[str, dict[str, str]] = {
    "this machine": {},
    # an AVX512 CPU without AMX (an AMD EPYC with AVX512-BF16), more OpenMP threads
    "avx512, no amx, 4 threads": {
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
        "MKL_ENABLE_INSTRUCTIONS": "AVX512",
        "ATEN_CPU_CAPABILITY": "avx512",
        "OPENBLAS_CORETYPE": "SkylakeX",
        "OMP_NUM_THREADS": "4",
        "OPENBLAS_NUM_THREADS": "4",
    },
    # an AVX2 CPU (no AVX512), MKL left to pick its own branch, numpy without its AVX512 loops
    "avx2": {
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "ATEN_CPU_CAPABILITY": "avx2",
        "OPENBLAS_CORETYPE": "Haswell",
        "NPY_ENABLE_CPU_FEATURES": "X86_V3",
    },
    # MKL told to reproduce its compatible (SSE2) branch, oneDNN capped at SSE4.1
    "sse": {"MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41", "OMP_NUM_THREADS": "1"},
}
# what the caps above set, removed first so that every imitation starts from the same place
ARITHMETIC_VARIABLES = sorted({name for caps in MACHINES.values() for name in caps} | {"MKL_CBWR", "NPY_DISABLE_CPU_FEATURES", "MKL_NUM_THREADS"})

ROWS = ("round", "client_id", "accuracy", "loss", "train_loss")


def quickstart(rounds: int = 2, **runtime: Any) -> dict[str, Any]:
    """The quickstart (HDC-FL, digits, 20 clients in four rotation groups), shortened:
    a refresh from round 1, so the server's grouping maths (numpy) counts too."""
    scenario = yaml.safe_load((REPO / "scenarios" / "quickstart.yaml").read_text())
    scenario["protocol"].update(rounds=rounds, participation=0.5)
    scenario["algorithm"]["hdcfl"].update(activation_round=1, refresh_every=1, groups=4)  # G as the golden files hold it
    scenario["runtime"].update(backend="local", **runtime)
    return scenario


def resnet_round(**runtime: Any) -> dict[str, Any]:
    """One round of HDC-FL with ResNet-18 on CIFAR-shaped synthetic images (32x32x3),
    four clients of a few images each."""
    return {
        "name": "resnet-round",
        "seed": 42,
        "dataset": {"name": "synthetic", "image_size": 32, "channels": 3, "num_classes": 4, "train_samples": 96, "test_samples": 48},
        "partition": {"kind": "rotation", "num_clients": 4, "angles": [0, 90]},
        "model": {"encoder": "resnet18_cifar"},
        "algorithm": {"name": "hdcfl", "hdcfl": {"groups": 2, "activation_round": 1, "refresh_every": 1}},
        "protocol": {"rounds": 1, "local_epochs": 1, "batch_size": 8, "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9}},
        "runtime": {"backend": "local", **runtime},
    }


def imitating(machine: str) -> dict[str, str]:
    """This process's environment with the arithmetic variables of `machine` only."""
    environment = {key: value for key, value in os.environ.items() if key not in ARITHMETIC_VARIABLES and key != "RAY_ADDRESS"}
    return {**environment, **MACHINES[machine]}


def simulate(
    scenario: dict[str, Any], run_dir: Path, machine: str, *overrides: str, timeout: float = 600, extra_environment: dict[str, str] | None = None
) -> Path:
    """`hdcfl-ray simulate` of `scenario` into `run_dir`, in a process imitating `machine`
    (and given `extra_environment`, such as a library to preload)."""
    path = run_dir.parent / f"{run_dir.name}.yaml"
    path.write_text(yaml.safe_dump(scenario, sort_keys=False))
    command = [sys.executable, "-m", "cli", "simulate", str(path), "--out", str(run_dir), "--quiet"]
    for override in overrides:
        command += ["--set", override]
    environment = {**imitating(machine), **(extra_environment or {})}
    completed = subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True, timeout=timeout)
    assert completed.returncode == 0, f"{machine}: {completed.stderr[-4000:]}"
    return run_dir


def clients_rows(run_dir: Path) -> list[tuple]:
    """Every scored client's round, id, accuracy, loss and training loss; floats as
    their exact hex, so equality is bit equality."""
    from hdcfl_ray.logs.table_writer import read_table

    clients = read_table(run_dir, "clients").to_pydict()
    rows = sorted(zip(*(clients[column] for column in ROWS)))
    return [tuple(float(value).hex() if isinstance(value, float) else value for value in row) for row in rows]
