"""The same FedAvg workload on Flower's Ray simulation and on hdcfl-ray, side by side.

    python -m benchmarks.vs_flower [--workload overhead|compute|both] [--flower-venv .venv-flower]
                                   [--backends local ray local-portable ray-portable] [--repeats 3]
                                   [--out docs/benchmarks.md] [--quick] [--cifar PATH]

Both simulators get identical client data: the workload is built once with
hdcfl-ray's own dataset and partition code and exported per client to an .npz
that benchmarks/flower_app.py reads. Each run is a fresh process measured from
launch to exit (Ray start-up included) with the peak PSS summed over its whole
process tree (driver, Ray daemons, workers). Each simulator and each hdcfl-ray
backend runs `--repeats` times as fresh processes, taking turns (Flower, then
each backend, then again), and the ratios are of the medians of this one
invocation.

Workloads:
  overhead  100 clients on digits, 10 rounds: tiny models and data, so the time is the
            simulator's own cost (scheduling, serialisation, start-up).
  compute   20 clients on 10,000 CIFAR-10 images, 3 rounds: training dominates.

Flower runs in its own venv (flwr[simulation] + torch), created on first use.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from benchmarks._common import Measured, append_markdown, find_cifar, machine_description, print_table, run_measured

REPO_ROOT = Path(__file__).resolve().parents[1]
FLOWER_APP = REPO_ROOT / "benchmarks" / "flower_app.py"
TIME_TARGET = 0.25  # hdcfl-ray's Ray backend: wall time / Flower's
LOCAL_TIME_TARGET = 0.15  # hdcfl-ray's local backend
GB = 1e9


@dataclass(frozen=True)
class Workload:
    name: str
    num_clients: int
    rounds: int
    dataset: dict[str, Any]
    local_epochs: int = 1
    batch_size: int = 32
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-4
    width: int = 16
    feature_dim: int = 64
    seed: int = 42


def workloads(names: list[str], quick: bool, cifar: Path | None) -> list[Workload]:
    chosen: list[Workload] = []
    if "overhead" in names:
        chosen.append(
            Workload("overhead", num_clients=10 if quick else 100, rounds=2 if quick else 10,
                     dataset={"name": "digits", "test_fraction": 0.2})
        )
    if "compute" in names:
        if cifar is None:
            print("skipping the compute workload: no CIFAR-10 Parquet folder (pass --cifar PATH or set HDCFL_CIFAR10)")
        else:
            chosen.append(
                Workload("compute", num_clients=10 if quick else 20, rounds=2 if quick else 3,
                         dataset={"name": "parquet_images", "path": str(cifar),
                                  "max_train_samples": 1000 if quick else 10_000,
                                  "max_test_samples": 200 if quick else 2_000})
            )
    return chosen


def scenario_dict(workload: Workload, output_dir: Path) -> dict[str, Any]:
    return {
        "name": f"vs-flower-{workload.name}",
        "seed": workload.seed,
        "dataset": workload.dataset,
        "partition": {"kind": "iid", "num_clients": workload.num_clients},
        "model": {"encoder": "small_cnn", "width": workload.width, "feature_dim": workload.feature_dim},
        "algorithm": {"name": "fedavg"},
        "protocol": {
            "rounds": workload.rounds,
            "participation": 1.0,  # every client trains and is evaluated every round, as in Flower
            "local_epochs": workload.local_epochs,
            "batch_size": workload.batch_size,
            "optimizer": {"name": "sgd", "lr": workload.lr, "momentum": workload.momentum, "weight_decay": workload.weight_decay},
            "eval_every": 1,
        },
        # Flower writes no checkpoints; neither should the run it is compared with.
        "checkpoint": {"every": None},
        "output": {"dir": str(output_dir)},
    }


def export_workload(scenario_path: Path, npz_path: Path) -> None:
    """Build the dataset and partition with hdcfl-ray's code and write each client's
    arrays, so Flower sees exactly the clients hdcfl-ray will simulate."""
    from hdcfl_ray.config.loading import load_scenario
    from hdcfl_ray.runtime.driver import prepare_run

    prepared = prepare_run(load_scenario(scenario_path))
    dataset = prepared.dataset
    arrays: dict[str, np.ndarray] = {
        "num_clients": np.array(len(prepared.partition.clients)),
        "num_classes": np.array(dataset.num_classes),
    }
    for client in prepared.partition.clients:
        # flower_app does not rotate images; an iid partition never asks it to.
        assert client.rotation_degrees == 0.0, "rotated partitions are not exported"
        i = client.client_id
        arrays[f"train_images_{i}"] = dataset.train_images[client.train_indices]
        arrays[f"train_labels_{i}"] = dataset.train_labels[client.train_indices].astype(np.int64)
        arrays[f"test_images_{i}"] = dataset.test_images[client.test_indices]
        arrays[f"test_labels_{i}"] = dataset.test_labels[client.test_indices].astype(np.int64)
    np.savez(npz_path, **arrays)  # uncompressed: Flower's load time should not be decompression


def clean_env() -> dict[str, str]:
    """Both runs start their own local Ray; a RAY_ADDRESS or PYTHONPATH from the caller's
    shell would attach to another cluster or mix the two venvs' packages."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTHONPATH", "VIRTUAL_ENV")}
    env["FLWR_TELEMETRY_ENABLED"] = "0"
    return env


def run_flower(workload: Workload, flower_python: Path, npz_path: Path) -> tuple[Measured, float | None]:
    cmd = [
        str(flower_python), str(FLOWER_APP),
        "--workload", str(npz_path),
        "--rounds", str(workload.rounds),
        "--local-epochs", str(workload.local_epochs),
        "--batch-size", str(workload.batch_size),
        "--lr", str(workload.lr),
        "--momentum", str(workload.momentum),
        "--weight-decay", str(workload.weight_decay),
        "--width", str(workload.width),
        "--feature-dim", str(workload.feature_dim),
        "--seed", str(workload.seed),
        "--num-cpus-per-client", "1",
    ]
    measured = run_measured(cmd, env=clean_env(), cwd=REPO_ROOT)
    accuracy = None
    for line in measured.stdout.splitlines():
        if line.startswith("FLOWER_RESULT "):
            accuracy = json.loads(line.removeprefix("FLOWER_RESULT "))["final_mean_accuracy"]
    return measured, accuracy


def run_hdcfl(scenario_path: Path, output_dir: Path, backend: str, runtime: tuple[str, ...] = ()) -> tuple[Measured, float | None]:
    """`backend`: local or ray, with -portable for runtime.portable (the command then
    restarts itself with the portable environment, which the wall time includes);
    `runtime`: KEY=VALUE settings of the runtime section for every hdcfl-ray run."""
    # The console script of the venv running this file: the project's venv.
    executable = Path(sys.executable).parent / "hdcfl-ray"
    backend, _, portable = backend.partition("-")
    cmd = [str(executable), "simulate", str(scenario_path), "--quiet", "--set", f"output.dir={output_dir}", "--set", f"runtime.backend={backend}",
           "--set", f"runtime.portable={'true' if portable else 'false'}"]  # fmt: skip
    for setting in runtime:
        cmd += ["--set", f"runtime.{setting}"]
    measured = run_measured(cmd, env=clean_env(), cwd=REPO_ROOT)
    run_dirs = [p for p in output_dir.iterdir() if p.is_dir()] if output_dir.is_dir() else []
    accuracy = final_accuracy(run_dirs[0]) if measured.returncode == 0 and len(run_dirs) == 1 else None
    return measured, accuracy


def final_accuracy(run_dir: Path) -> float | None:
    import pyarrow.parquet as pq

    table = pq.read_table(run_dir / "rounds.parquet", columns=["round", "mean_accuracy"]).to_pylist()
    return max(table, key=lambda row: row["round"])["mean_accuracy"] if table else None


def ensure_flower_venv(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"creating the Flower venv at {venv} (flwr[simulation] + torch; takes minutes) ...", flush=True)
        subprocess.run(["python3.11", "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "flwr[simulation]", "torch==2.14.1"], check=True)
    return python


def flower_versions(flower_python: Path) -> str:
    """Package versions inside the Flower venv (its Ray differs from the project's)."""
    code = "import importlib.metadata as m; print(', '.join(p + ' ' + m.version(p) for p in ('flwr', 'ray', 'torch')))"
    result = subprocess.run([str(flower_python), "-c", code], capture_output=True, text=True, env=clean_env())
    return result.stdout.strip() or "unknown"


def report_failure(label: str, measured: Measured) -> None:
    print(f"  {label} failed (exit {measured.returncode}); last lines of its output:", file=sys.stderr)
    for line in (measured.stdout + measured.stderr).strip().splitlines()[-25:]:
        print(f"    {line}", file=sys.stderr)


def compare(workload: Workload, flower_python: Path, backends: list[str], repeats: int, runtime: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    labels = ["flower", *(f"hdcfl-ray ({backend})" for backend in backends)]
    runs: dict[str, list[tuple[Measured, float | None]]] = {label: [] for label in labels}
    with tempfile.TemporaryDirectory(prefix=f"vs-flower-{workload.name}-") as tmp:
        tmp_path = Path(tmp)
        scenario_path = tmp_path / "scenario.yaml"
        scenario_path.write_text(yaml.safe_dump(scenario_dict(workload, tmp_path / "runs"), sort_keys=False))
        npz_path = tmp_path / "workload.npz"
        print(f"[{workload.name}] exporting {workload.num_clients} clients ...", flush=True)
        export_workload(scenario_path, npz_path)
        for repeat in range(repeats):
            # Taking turns, so a drift in the machine's load reaches every simulator alike.
            for label in labels:
                if label == "flower":
                    measured, accuracy = run_flower(workload, flower_python, npz_path)
                else:
                    backend = label.split("(")[1].rstrip(")")
                    measured, accuracy = run_hdcfl(scenario_path, tmp_path / f"runs-{backend}-{repeat}", backend, runtime)
                if measured.returncode != 0:
                    report_failure(label, measured)
                runs[label].append((measured, accuracy))
                print(f"[{workload.name}] {label} #{repeat + 1}: {measured.wall_s:.1f} s, {measured.peak_memory_bytes / GB:.2f} GB", flush=True)

    def ok(label: str) -> bool:
        return all(measured.returncode == 0 for measured, _ in runs[label])

    def median_wall(label: str) -> float:
        return statistics.median(measured.wall_s for measured, _ in runs[label])

    def peak(label: str) -> float:
        return max(measured.peak_memory_bytes for measured, _ in runs[label]) / GB

    rows = []
    for label in labels:
        ratio = median_wall(label) / median_wall("flower") if label != "flower" and ok(label) and ok("flower") else None
        memory_ratio = peak(label) / peak("flower") if label != "flower" and ok(label) and ok("flower") else None
        # the targets are set on the overhead-bound workload, where the simulator's own costs show
        target = (LOCAL_TIME_TARGET if "local" in label else TIME_TARGET) if label != "flower" and workload.name == "overhead" else None
        rows.append({
            "workload": f"{workload.name} ({workload.num_clients} clients x {workload.rounds} rounds)",
            "simulator": label if ok(label) else f"{label} (FAILED)",
            "median wall s": median_wall(label),
            "runs s": " / ".join(f"{measured.wall_s:.1f}" for measured, _ in runs[label]),
            "peak mem GB": peak(label),
            "final acc": runs[label][-1][1],
            "time ratio": ratio,
            "time target": target,
            "met": (ratio <= target) if ratio is not None and target is not None else None,
            "mem ratio": memory_ratio,
        })
    return rows


def portable_costs(rows: list[dict[str, Any]]) -> list[str]:
    """runtime.portable's cost: each -portable backend's median wall time over the same
    backend's without it, in the same workload."""
    walls = {(row["workload"], row["simulator"]): row["median wall s"] for row in rows}
    lines = []
    for (workload, simulator), wall in walls.items():
        plain = simulator.replace("-portable)", ")")
        if simulator.endswith("-portable)") and (workload, plain) in walls:
            lines.append(f"{workload}: {simulator} takes {wall / walls[(workload, plain)]:.3f}x the time of {plain}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=("overhead", "compute", "both"), default="both")
    parser.add_argument("--flower-venv", default=".venv-flower", help="relative to the repository root")
    parser.add_argument("--out", help="markdown file to append the results to, e.g. docs/benchmarks.md")
    parser.add_argument("--quick", action="store_true", help="small versions of the workloads, for testing")
    parser.add_argument("--backends", nargs="+", choices=("local", "ray", "local-portable", "ray-portable"), default=["local", "ray"],
                        help="hdcfl-ray backends to run; -portable: with runtime.portable (its cost against the same backend without)")
    parser.add_argument("--runtime", nargs="*", default=[], metavar="KEY=VALUE",
                        help="runtime settings for every hdcfl-ray run, e.g. precision=fp32 (a CPU where auto picks bf16)")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per simulator (the medians are compared)")
    parser.add_argument("--cifar", help="CIFAR-10 Parquet folder (default: $HDCFL_CIFAR10_PARQUET, $HDCFL_CIFAR10 or data/cifar10-parquet)")
    args = parser.parse_args()

    names = ["overhead", "compute"] if args.workload == "both" else [args.workload]
    chosen = workloads(names, args.quick, find_cifar(args.cifar))
    if not chosen:
        return 1
    flower_python = ensure_flower_venv(REPO_ROOT / args.flower_venv)
    rows = [row for workload in chosen for row in compare(workload, flower_python, args.backends, args.repeats, tuple(args.runtime))]
    machine = {**machine_description(), "flower venv": flower_versions(flower_python)}
    print()
    print_table(rows)
    print(f"\nratios are medians of hdcfl-ray / Flower; time targets: local backend <= {LOCAL_TIME_TARGET}, Ray backend <= {TIME_TARGET}")
    for line in portable_costs(rows):
        print(line)
    if args.out:
        command = " ".join(["python -m benchmarks.vs_flower", *(shlex.quote(a) for a in sys.argv[1:])])
        title = "hdcfl-ray vs Flower, FedAvg" + (" (quick)" if args.quick else "")
        append_markdown(args.out, title, command, machine, rows)
        print(f"appended to {args.out}")
    failed = any("FAILED" in str(row["simulator"]) for row in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
