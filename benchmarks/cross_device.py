"""Cross-device scale: evaluation cost per client, and 100,000 clients end to end.

The workload a cross-device study runs: many clients with little data each
(synthetic 8x8 grayscale images, 20 training and 5 test images per client),
`small_cnn` width 8 with 16 features, FedAvg, 10 participants per round, the
local backend. Every measurement is a fresh `hdcfl-ray simulate` process.

- `eval`: K = 10,000, 5 rounds, evaluation at rounds 2, 4 and 5. The cost of an
  evaluation per client is (mean wall time of an evaluated round - mean of a
  training-only round) / K, from the run's rounds table. Measured with batched
  evaluation (the default) and, in the same invocation, one client at a time
  (`runtime.batched_evaluation: false`), so the speed-up is a ratio of one run.
  Target: at most 0.2 ms per client.
- `large`: K = 100,000, 3 rounds, every client evaluated at the last round only:
  wall time from launch to exit and peak memory (PSS of the process tree).
  Target: within 4 minutes and 6 GB.
- `setup`: the time outside the rounds (start-up, data, partition, hosts,
  shutdown) for K = 1,000, 10,000 and 100,000 training-only runs (1 round):
  setup grows with K, a round does not.

    python -m benchmarks.cross_device                      # all three, 3 processes each
    python -m benchmarks.cross_device --parts eval --repeats 1 --out docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from benchmarks._common import append_markdown, machine_description, print_table, run_measured
from hdcfl_ray.logs.table_writer import read_table

REPO = Path(__file__).resolve().parents[1]

TRAIN_PER_CLIENT = 20
TEST_PER_CLIENT = 5


def scenario(clients: int, rounds: int, eval_every: int, out_dir: Path, batched: bool = True) -> dict[str, Any]:
    return {
        "name": f"cross-device-k{clients}",
        "seed": 42,
        "dataset": {
            "name": "synthetic",
            "num_classes": 10,
            "image_size": 8,
            "channels": 1,
            "train_samples": TRAIN_PER_CLIENT * clients,
            "test_samples": TEST_PER_CLIENT * clients,
        },
        "partition": {"kind": "iid", "num_clients": clients, "test_per_client": TEST_PER_CLIENT},
        "model": {"encoder": "small_cnn", "width": 8, "feature_dim": 16},
        "algorithm": {"name": "fedavg"},
        "protocol": {"rounds": rounds, "participation": 10, "local_epochs": 1, "batch_size": 20, "eval_every": eval_every},
        "runtime": {"backend": "local", "batched_evaluation": batched},
        "checkpoint": {"every": None},
        "output": {"dir": str(out_dir)},
    }


def simulate(spec: dict[str, Any], work: Path, label: str) -> tuple[Any, dict[str, list[Any]]]:
    path = work / f"{label}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    measured = run_measured([str(Path(sys.executable).with_name("hdcfl-ray")), "simulate", str(path), "--quiet"], cwd=REPO)
    if measured.returncode != 0:
        raise SystemExit(f"{label} failed:\n{measured.stderr[-3000:]}")
    run_dir = max(Path(spec["output"]["dir"]).iterdir(), key=lambda p: p.stat().st_mtime)
    return measured, read_table(run_dir, "rounds").sort_by("round").to_pydict()


def evaluation_cost(work: Path, clients: int, batched: bool, index: int) -> float:
    """ms per client of one evaluation: evaluated rounds minus training-only rounds."""
    label = f"eval-k{clients}-{'batched' if batched else 'per-client'}-{index}"
    _, rounds = simulate(scenario(clients, rounds=5, eval_every=2, out_dir=work / label, batched=batched), work, label)
    evaluated = [w for w, e in zip(rounds["wall_time_s"], rounds["evaluated"]) if e]
    training = [w for w, e in zip(rounds["wall_time_s"], rounds["evaluated"]) if not e]
    return (statistics.mean(evaluated) - statistics.mean(training)) / clients * 1000.0


def measure_eval(work: Path, repeats: int, clients: int) -> list[dict[str, Any]]:
    rows = []
    costs: dict[bool, list[float]] = {True: [], False: []}
    for index in range(repeats):
        for batched in (True, False):  # alternated, so a drift in machine load hits both
            costs[batched].append(evaluation_cost(work, clients, batched, index))
    for batched in (True, False):
        rows.append(
            {
                "measure": f"evaluation, K = {clients:,}, {'batched (default)' if batched else 'one client at a time'}",
                "ms_per_client": statistics.median(costs[batched]),
                "runs": " / ".join(f"{c:.3f}" for c in costs[batched]),
                "target": "<= 0.2 ms" if batched else "",
            }
        )
    rows[0]["speedup"] = statistics.median(costs[False]) / statistics.median(costs[True])
    return rows


def measure_large(work: Path, repeats: int, clients: int) -> list[dict[str, Any]]:
    walls, peaks, evals = [], [], []
    for index in range(repeats):
        label = f"large-k{clients}-{index}"
        measured, rounds = simulate(scenario(clients, rounds=3, eval_every=3, out_dir=work / label), work, label)
        walls.append(measured.wall_s)
        peaks.append(measured.peak_memory_bytes / 1e9)
        evals.append(rounds["wall_time_s"][-1])
    return [
        {
            "measure": f"K = {clients:,}, 3 rounds of 10, all clients evaluated at round 3",
            "wall_s": statistics.median(walls),
            "runs": " / ".join(f"{w:.1f}" for w in walls),
            "eval_round_s": statistics.median(evals),
            "peak_memory_gb": max(peaks),
            "target": "<= 240 s, <= 6 GB",
        }
    ]


def measure_setup(work: Path, repeats: int, sizes: list[int]) -> list[dict[str, Any]]:
    rows = []
    for clients in sizes:
        outside, round_walls = [], []
        for index in range(repeats):
            label = f"setup-k{clients}-{index}"
            measured, rounds = simulate(scenario(clients, rounds=2, eval_every=10, out_dir=work / label), work, label)
            round_walls.append(rounds["wall_time_s"][0])  # round 1: training only (the last round is evaluated)
            outside.append(measured.wall_s - rounds["elapsed_s"][-1])
        rows.append(
            {
                "measure": f"K = {clients:,}, training only",
                "outside_rounds_s": statistics.median(outside),
                "training_round_s": statistics.median(round_walls),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=["eval", "large", "setup"], default=["eval", "large", "setup"])
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per measurement (median)")
    parser.add_argument("--eval-clients", type=int, default=10_000)
    parser.add_argument("--large-clients", type=int, default=100_000)
    parser.add_argument("--setup-clients", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--out", type=Path, default=None, help="append the results to this markdown file")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="hdcfl-cross-device-") as temporary:
        work = Path(temporary)
        if "eval" in args.parts:
            rows += measure_eval(work, args.repeats, args.eval_clients)
            print_table(rows[-2:])
        if "large" in args.parts:
            rows += measure_large(work, args.repeats, args.large_clients)
            print_table(rows[-1:])
        if "setup" in args.parts:
            rows += measure_setup(work, args.repeats, args.setup_clients)
            print_table(rows[-len(args.setup_clients) :])
    print()
    print_table(rows)
    if args.out is not None:
        command = "python -m benchmarks.cross_device " + " ".join(sys.argv[1:])
        title = "Cross-device scale (FedAvg, synthetic 8x8, 20/5 images per client, 10 participants, local backend)"
        append_markdown(args.out, title, command.strip(), machine_description(), rows)


if __name__ == "__main__":
    main()
