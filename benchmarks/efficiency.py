"""Efficiency against the limit: local-training throughput of a FedAvg-SE simulation
divided by that of a plain single-process PyTorch loop.

Both train the same small CNN (width 16, 64 features, a linear head) with the
same batch size on the same CIFAR-10 images (the first N of the Parquet copy
that --cifar or $HDCFL_CIFAR10_PARQUET names, after the loader's seeded subset), for the same
number of samples: 20 clients x (N / 20) images x 1 local epoch x R rounds. The
plain loop uses every core through torch's threads and does nothing else. The
simulation is timed from the start of round 1 to the end of the last round
(server aggregation, client evaluation at the last round and logging included;
Ray's and the process's start-up excluded, reported beside it).

    python -m benchmarks.efficiency
    python -m benchmarks.efficiency --backend ray --out docs/benchmarks.md
    python -m benchmarks.efficiency --backend ray --runtime num_gpus_per_actor=0.25 --encoder resnet18_cifar  # a GPU machine
    python -m benchmarks.efficiency --mode both --repeats 3  # runtime.portable's cost: both modes, taking turns

`--mode portable` runs the simulation with runtime.portable in a process started
with the portable environment (the script restarts itself with it), so the plain
loop beside it computes with the same pinned libraries: the efficiency row then
says what the simulator adds, and the samples/s against a default-mode row what
the pins cost.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._common import append_markdown, find_cifar, machine_description, module_environment, print_table

CLIENTS = 20


def cifar_path(explicit: str | None) -> Path:
    path = find_cifar(explicit)
    if path is None:
        raise SystemExit("CIFAR-10 Parquet folder not found: pass --cifar PATH or set HDCFL_CIFAR10_PARQUET (python scripts/cifar10_to_parquet.py builds one)")
    return path


def build_scenario(
    path: Path, images: int, rounds: int, batch_size: int, backend: str, out_dir: Path, runtime: dict | None = None, encoder: str = "small_cnn"
):
    from hdcfl_ray.config.loading import build_scenario as build

    return build(
        {
            "name": "efficiency",
            "seed": 42,
            "dataset": {"name": "parquet_images", "path": str(path), "max_train_samples": images, "max_test_samples": 2000},
            "partition": {"kind": "iid", "num_clients": CLIENTS},
            "model": {"encoder": encoder, "width": 16, "feature_dim": 64} if encoder == "small_cnn" else {"encoder": encoder},
            "algorithm": {"name": "fedavg_se"},
            # evaluated once, after the last round: the figure is about training throughput
            "protocol": {"rounds": rounds, "local_epochs": 1, "batch_size": batch_size, "eval_every": rounds,
                         "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 5.0e-4}},
            "runtime": {"backend": backend, **(runtime or {})},
            "checkpoint": {"every": None},
            "output": {"dir": str(out_dir)},
        }
    )


def runtime_overrides(pairs: list[str]) -> dict:
    """--runtime torch_threads=2 channels_last=true -> {"torch_threads": 2, "channels_last": True}."""
    import yaml

    overrides = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        overrides[key] = yaml.safe_load(value)
    return overrides


def plain_loop(prepared, rounds: int, batch_size: int) -> tuple[float, int]:
    """Samples per second of one process training the same model on the same images."""
    import torch

    from benchmarks._workload import plain_epochs
    from hdcfl_ray.data.transforms import to_float_batch
    from hdcfl_ray.models import build_split_model
    from hdcfl_ray.runtime.client.device import choose_device, configure_cuda

    torch.set_num_threads(os.cpu_count() or 1)
    # the device the simulation's hosts get (a GPU share: CUDA), with their CUDA settings
    runtime = prepared.scenario.runtime
    device = choose_device(runtime)
    configure_cuda(runtime, device)
    dataset = prepared.dataset
    model = build_split_model(prepared.scenario.model, in_channels=3, num_classes=dataset.num_classes, seed=0).to(device)
    inputs = to_float_batch(dataset.train_images).to(device)
    labels = torch.as_tensor(dataset.train_labels, dtype=torch.long, device=device)
    parameters = [*model.encoder.parameters(), *model.head.parameters()]
    optimizer = torch.optim.SGD(parameters, lr=0.05, momentum=0.9, weight_decay=5.0e-4)
    started = time.perf_counter()
    samples = plain_epochs(model, inputs, labels, optimizer, batch_size, rounds)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return samples / (time.perf_counter() - started), samples


def simulation(prepared, out_dir: Path) -> dict:
    from hdcfl_ray.logs.table_writer import read_table
    from hdcfl_ray.runtime.driver import run_simulation

    started = time.perf_counter()
    summary = run_simulation(prepared, out_dir / "run")
    total = time.perf_counter() - started
    rounds = read_table(summary.run_dir, "rounds").sort_by("round").to_pydict()
    trained = int(sum(read_table(summary.run_dir, "updates").to_pydict()["num_samples"]))
    round_seconds = float(sum(rounds["wall_time_s"]))
    return {"samples": trained, "rounds_s": round_seconds, "total_s": total, "final_mean_acc": float(rounds["mean_accuracy"][-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=10_000, help="CIFAR-10 training images (split over 20 clients)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--backend", choices=["auto", "ray", "local"], default="auto")
    parser.add_argument("--cifar", default=None)
    parser.add_argument("--encoder", default="small_cnn", choices=["small_cnn", "resnet18_cifar"],
                    help="resnet18_cifar: the compute-bound ResNet-18 case (use fewer --images)")
    parser.add_argument("--runtime", nargs="*", default=[], metavar="KEY=VALUE",
                    help="runtime settings of the simulation, e.g. torch_threads=2 channels_last=true precision=bf16")
    parser.add_argument("--out", type=Path, default=None, help="append the results to this markdown file")
    parser.add_argument("--repeats", type=int, default=1, help="fresh processes to run; the row holds their medians")
    parser.add_argument("--mode", choices=["default", "portable", "both"], default="default",
                        help="runtime.portable off, on, or both taking turns (their cost: samples/s of one over the other)")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # one measurement, as JSON (for --repeats)
    args = parser.parse_args()
    if args.mode == "portable":
        restart_pinned()
    if args.mode == "both":
        rows = both_modes(args)
    elif args.repeats > 1:
        rows = [repeated(args)]
    else:
        rows = [measure(args)]
        if args.json:
            print("EFFICIENCY_ROW " + json.dumps(rows[0]))
            return
    print_table(rows)
    if args.out is not None:
        command = "python -m benchmarks.efficiency " + " ".join(sys.argv[1:])
        append_markdown(args.out, "Efficiency against a plain PyTorch loop (FedAvg-SE, 20 clients, CIFAR-10)", command.strip(), machine_description(), rows)


def restart_pinned() -> None:
    """This module again, started with the portable environment (unless it was); the
    repository leads PYTHONPATH so that `-m` finds it from any working directory (the
    one of this process is kept: its relative --out and --cifar mean what they meant)."""
    from hdcfl_ray.portable.environment import portable_environment
    from hdcfl_ray.portable.process import unpinned_libraries

    if unpinned_libraries():
        os.execve(sys.executable, [sys.executable, "-m", "benchmarks.efficiency", *sys.argv[1:]], module_environment(portable_environment()))


def _forwarded(*dropped: str) -> list[str]:
    """This command's arguments without --json, --out, and the options named (each with its value)."""
    forwarded = [argument for argument in sys.argv[1:] if argument != "--json"]
    for option in ("--out", *dropped):
        if option in forwarded:
            position = forwarded.index(option)
            del forwarded[position : position + 2]
    return forwarded


def _child_row(arguments: list[str], index: int) -> dict:
    """One measurement in a fresh process."""
    output = subprocess.run([sys.executable, "-m", "benchmarks.efficiency", *arguments, "--json"], env=module_environment(),
                            capture_output=True, text=True, check=True).stdout
    row = json.loads(next(line for line in output.splitlines() if line.startswith("EFFICIENCY_ROW ")).removeprefix("EFFICIENCY_ROW "))
    print(f"run {index + 1} ({row['backend']}): efficiency {row['efficiency']:.3f} ({row['simulation_samples_per_s']:.0f} vs {row['plain_loop_samples_per_s']:.0f} samples/s)", flush=True)
    return row


def both_modes(args: argparse.Namespace) -> list[dict]:
    """Default and portable runs taking turns (a drift in the machine's load reaches both
    alike), a row of medians for each, and the portable mode's cost."""
    forwarded = _forwarded("--repeats", "--mode")
    measured: dict[str, list[dict]] = {"default": [], "portable": []}
    for index in range(max(1, args.repeats)):
        for mode in measured:
            measured[mode].append(_child_row([*forwarded, "--mode", mode], index))
    rows = [_medians(runs, len(runs)) for runs in measured.values()]
    cost = rows[0]["simulation_samples_per_s"] / rows[1]["simulation_samples_per_s"]
    print(f"runtime.portable: the simulation takes {cost:.3f}x the default mode's time (median samples/s, default over portable)")
    for row in rows:
        row["portable_time_ratio"] = cost
    return rows


def repeated(args: argparse.Namespace) -> dict:
    """The medians of `--repeats` fresh processes, each measuring as a single run does."""
    forwarded = _forwarded("--repeats")
    return _medians([_child_row(forwarded, index) for index in range(args.repeats)], args.repeats)


def _medians(measured: list[dict], repeats: int) -> dict:
    median = {key: statistics.median(row[key] for row in measured) for key, value in measured[0].items() if isinstance(value, float)}
    return {
        **measured[0],
        **median,
        "runs": repeats,
        "efficiency_runs": " / ".join(f"{row['efficiency']:.3f}" for row in measured),
        "target_0.9_met": median["efficiency"] >= 0.9,
    }


def measure(args: argparse.Namespace) -> dict:
    from hdcfl_ray.runtime.driver import prepare_run

    with tempfile.TemporaryDirectory(prefix="hdcfl-efficiency-") as work:
        runtime = {**runtime_overrides(args.runtime), **({"portable": True} if args.mode == "portable" else {})}
        prepared = prepare_run(build_scenario(cifar_path(args.cifar), args.images, args.rounds, args.batch_size, args.backend, Path(work), runtime, args.encoder))
        # The plain loop runs before and after the simulation and the faster of the two
        # counts: the machine's speed drifts, and the limit should not be understated.
        plain_before, plain_samples = plain_loop(prepared, args.rounds, args.batch_size)
        result = simulation(prepared, Path(work))
        plain_after, _ = plain_loop(prepared, args.rounds, args.batch_size)
        plain_sps = max(plain_before, plain_after)
    assert result["samples"] == plain_samples, (result["samples"], plain_samples)
    simulated_sps = result["samples"] / result["rounds_s"]
    return {
        "backend": args.backend + "".join(f" {pair}" for pair in args.runtime) + ("" if args.encoder == "small_cnn" else f" {args.encoder}")
        + (" portable" if args.mode == "portable" else ""),
        "samples": plain_samples,
        "plain_loop_samples_per_s": plain_sps,
        "plain_loop_runs": f"{plain_before:.0f} / {plain_after:.0f}",
        "simulation_samples_per_s": simulated_sps,
        "efficiency": simulated_sps / plain_sps,
        "target_0.9_met": simulated_sps / plain_sps >= 0.9,
        "simulation_rounds_s": result["rounds_s"],
        "simulation_with_startup_s": result["total_s"],
        "efficiency_with_startup": result["samples"] / result["total_s"] / plain_sps,
        "final_mean_acc": result["final_mean_acc"],
    }


if __name__ == "__main__":
    main()
