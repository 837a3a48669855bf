"""Scale curve: wall time per round and peak memory of HDC-FL for K = 10, 100, 1000 clients.

Every client holds the same amount of synthetic data (16x16 RGB, four rotation
groups), so the training work per round grows linearly with K; the per-round
time should grow no faster. Each K runs `hdcfl-ray simulate` as a fresh process
(start-up included in the wall time), three rounds, with HDC-FL refreshes at
rounds 2 and 3; the refresh time is the server's aggregation time of a refresh
round (rounds.parquet `aggregate_s`).

    python -m benchmarks.scale                          # K = 10, 100, 1000
    python -m benchmarks.scale --clients 10 100 --backend ray --out docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import yaml

from benchmarks._common import append_markdown, machine_description, print_table, run_measured
from hdcfl_ray.logs.table_writer import read_table

REPO = Path(__file__).resolve().parents[1]


def scenario(clients: int, samples_per_client: int, backend: str, out_dir: Path) -> dict:
    return {
        "name": f"scale-k{clients}",
        "seed": 42,
        "dataset": {
            "name": "synthetic",
            "num_classes": 10,
            "image_size": 16,
            "channels": 3,
            "train_samples": samples_per_client * clients,
            "test_samples": max(100, 10 * clients),
        },
        "partition": {"kind": "rotation", "num_clients": clients, "angles": [0, 90, 180, 270], "test_per_client": 10},
        "model": {"encoder": "small_cnn", "width": 16, "feature_dim": 64},
        "algorithm": {"name": "hdcfl", "hdcfl": {"groups": 4, "activation_round": 2, "refresh_every": 1}},
        "protocol": {"rounds": 3, "participation": 1.0, "local_epochs": 1, "batch_size": 32},
        "runtime": {"backend": backend},
        "checkpoint": {"every": None},
        "output": {"dir": str(out_dir)},
    }


def measure(clients: int, samples_per_client: int, backend: str, work: Path) -> dict:
    out_dir = work / f"k{clients}"
    path = work / f"k{clients}.yaml"
    path.write_text(yaml.safe_dump(scenario(clients, samples_per_client, backend, out_dir), sort_keys=False))
    measured = run_measured([str(Path(sys.executable).with_name("hdcfl-ray")), "simulate", str(path), "--quiet"], cwd=REPO)
    if measured.returncode != 0:
        raise SystemExit(f"K = {clients} failed:\n{measured.stderr[-3000:]}")
    run_dir = next(out_dir.iterdir())
    rounds = read_table(run_dir, "rounds").sort_by("round").to_pydict()
    refresh_round = max(read_table(run_dir, "refresh").to_pydict()["round"])
    return {
        "clients": clients,
        "backend": backend,
        "train_samples_per_round": clients * samples_per_client,
        "wall_s_total": measured.wall_s,
        "round_1_s": rounds["wall_time_s"][0],
        "round_2_s": rounds["wall_time_s"][1],
        "round_3_s": rounds["wall_time_s"][2],
        "s_per_1k_samples_round_3": rounds["wall_time_s"][2] / (clients * samples_per_client / 1000),
        # the last refresh: the first one also pays for importing scikit-learn (about 1 s)
        "refresh_s": rounds["aggregate_s"][rounds["round"].index(refresh_round)],
        "peak_memory_gb": measured.peak_memory_bytes / 1e9,
        "final_mean_acc": rounds["mean_accuracy"][-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--samples-per-client", type=int, default=50)
    parser.add_argument("--backend", choices=["auto", "ray", "local"], default="auto")
    parser.add_argument("--out", type=Path, default=None, help="append the results to this markdown file")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="hdcfl-scale-") as work:
        for clients in args.clients:
            print(f"K = {clients} ...", flush=True)
            rows.append(measure(clients, args.samples_per_client, args.backend, Path(work)))
            print_table(rows[-1:])
    print()
    print_table(rows)
    if args.out is not None:
        command = "python -m benchmarks.scale " + " ".join(sys.argv[1:])
        append_markdown(args.out, "Scale curve (HDC-FL, small CNN, synthetic 16x16 data)", command.strip(), machine_description(), rows)


if __name__ == "__main__":
    main()
