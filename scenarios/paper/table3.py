"""Paper table 3 at its real size in one GPU command: HDC-FL on
scenarios/paper/c10-rot-no-pretrain.yaml (CIFAR-10, 20 clients of 2,500 images in four
rotation groups, ResNet-18 from its seeded initialisation, 100 rounds, its refresh
cache), the table's two other rows replayed from that run's saved refreshes (no
prototype: lambda = 0, the global encoder; one prototype: G = 1), and the table-3
report over the run and its replays.

    python scenarios/paper/table3.py --cifar PATH [--seeds 42] [--out DIR] [--budget 570]
    python scenarios/paper/table3.py --dry-run             # anywhere: the same commands, tiny, on the CPU

PATH is a CIFAR-10 Parquet folder (train.parquet, test.parquet; scripts/cifar10_to_parquet.py
writes one), else $HDCFL_CIFAR10_PARQUET. The runs go under --out (default $OUT/table3
when $OUT is set, else runs/table3), one client host holding every client on the GPU
(`runtime.backend: local`, `num_gpus_per_actor: 1`: no Ray needed) with the CUDA
defaults (batched training). A seed that would not finish within --budget seconds is
not started (each seed's run and replays are timed and the next seed needs as long as the
slowest so far); the report says which seeds it holds. The report is written to
OUT/table3.md; `--report FILE` writes it elsewhere too (e.g. docs/reproduction-table3-gpu.md).

Rerunning skips what is finished: a seed with a finished run and both replays is reused.
`--dry-run` writes a 64-image Parquet folder, runs two rounds of 4 clients with a small CNN on
the CPU through exactly these commands and checks that the report names the three rows
(tests/test_table3_script.py).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

# `hdcfl-ray` beside this Python when installed, else the same app from cli.py (as the GPU check runs it)
from benchmarks.gpu_check import cli_command as cli  # noqa: E402  (standard library only)

SCENARIO = REPO / "scenarios/paper/c10-rot-no-pretrain.yaml"
# the table's rows besides the run itself (G = 4): `hdcfl-ray ablate --set algorithm.hdcfl.KEY=VALUE`
REPLAYS = {"mix-0": "mix=0", "groups-1": "groups=1"}
ROW_NAMES = {"": "head-derived, G = 4 (the run)", ".mix-0": "no prototype (lambda = 0)", ".groups-1": "one prototype (G = 1)"}
DRY_RUN_SETS = [
    "name=table3-dry", "model.encoder=small_cnn", "model.width=8", "model.feature_dim=16", "partition.num_clients=4",
    "partition.test_per_client=8", "protocol.rounds=2", "protocol.participation=2", "protocol.batch_size=8",
    "algorithm.hdcfl.activation_round=1", "algorithm.hdcfl.refresh_every=1", "algorithm.hdcfl.groups=2",
    "runtime.num_gpus_per_actor=0",
]


def run(command: list[str]) -> float:
    """Run a step, its output shown as it comes; its seconds, or exit with its code."""
    print(f"[table3] {' '.join(command)}", flush=True)
    started = time.perf_counter()
    completed = subprocess.run(command, cwd=REPO)
    if completed.returncode != 0:
        print(f"[table3] error: the command above exited {completed.returncode}", file=sys.stderr)
        sys.exit(completed.returncode)
    return time.perf_counter() - started


def finished(run_dir: Path) -> bool:
    manifest = run_dir / "manifest.json"
    return manifest.is_file() and json.loads(manifest.read_text()).get("status") == "completed"


def write_tiny_parquet(folder: Path) -> Path:
    """A 64 + 32 image CIFAR-shaped Parquet folder (PNG bytes, 10 classes) for the dry run."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    generator = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for part, count in (("train", 64), ("test", 32)):
        labels = np.arange(count) % 10
        images = []
        for label in labels:
            pixels = (generator.random((32, 32, 3)) * 60 + label * 19).clip(0, 255).astype(np.uint8)
            buffer = io.BytesIO()
            Image.fromarray(pixels).save(buffer, format="PNG")
            images.append(buffer.getvalue())
        pq.write_table(pa.table({"image": images, "label": labels.astype(np.int64)}), folder / f"{part}.parquet")
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cifar", default=os.environ.get("HDCFL_CIFAR10_PARQUET"), help="the CIFAR-10 Parquet folder")
    parser.add_argument("--seeds", default="42", help="comma-separated seeds (the paper's: 42,123,2026)")
    default_out = Path(os.environ["OUT"]) / "table3" if os.environ.get("OUT") else REPO / "runs/table3"
    parser.add_argument("--out", type=Path, default=default_out, help="folder for the runs, replays and report")
    parser.add_argument("--report", type=Path, default=None, help="also write the report here")
    parser.add_argument("--budget", type=float, default=570.0, help="seconds; a seed that would not fit is not started")
    parser.add_argument("--dry-run", action="store_true", help="tiny, on the CPU: checks the commands without a GPU")
    args = parser.parse_args(argv)
    try:
        seeds = [int(seed) for seed in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds: {args.seeds!r} is not a comma-separated list of integers")
    began = time.perf_counter()
    sets = ["dataset.name=parquet_images", "runtime.backend=local", "runtime.num_gpus_per_actor=1", "checkpoint.every=null"]
    if args.dry_run:
        args.cifar = str(write_tiny_parquet(args.out / "tiny-parquet"))
        sets += DRY_RUN_SETS
    if not args.cifar or not (Path(args.cifar) / "train.parquet").is_file():
        print(f"error: no CIFAR-10 Parquet folder ({args.cifar!r}): pass --cifar PATH or set HDCFL_CIFAR10_PARQUET "
              "(python scripts/cifar10_to_parquet.py writes one)", file=sys.stderr)
        return 2
    sets.append(f"dataset.path={Path(args.cifar).resolve()}")
    run(cli() + ["validate", str(SCENARIO), *[arg for value in sets for arg in ("--set", value)]])

    runs, replays, slowest = [], [], 0.0
    for seed in seeds:
        left = args.budget - (time.perf_counter() - began)
        run_dir = args.out / "hdcfl" / f"seed{seed}"
        targets = {name: args.out / "replays" / name / f"seed{seed}" for name in REPLAYS}
        done = finished(run_dir) and all(finished(target) for target in targets.values())
        if not done and slowest and left < slowest * 1.05:
            print(f"[table3] seed {seed} not started: {left:.0f} s of the budget left, a seed took {slowest:.0f} s", flush=True)
            continue
        seed_started = time.perf_counter()
        if not finished(run_dir):
            run(cli() + ["simulate", str(SCENARIO), *[arg for value in [*sets, f"seed={seed}"] for arg in ("--set", value)],
                         "--out", str(run_dir), "--quiet"])
        for name, change in REPLAYS.items():
            if not finished(targets[name]):
                run(cli() + ["ablate", str(run_dir), "--set", f"algorithm.hdcfl.{change}", "--out", str(targets[name])])
        if not done:
            slowest = max(slowest, time.perf_counter() - seed_started)
        runs.append(run_dir)
        replays.extend(targets.values())
    if not runs:
        print("[table3] error: no seed fitted the budget", file=sys.stderr)
        return 1
    report = args.out / "table3.md"
    run(cli() + ["report", *map(str, runs), *map(str, replays), "--format", "md", "--out", str(report)])
    text = report.read_text()
    if args.dry_run:
        missing = [suffix for suffix in ROW_NAMES if f"table3-dry{suffix}" not in text and suffix]
        if missing:
            print(f"[table3] error: the report lacks the replays {missing}", file=sys.stderr)
            return 1
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(text)
    print(f"[table3] {len(runs)} seed(s) in {time.perf_counter() - began:.0f} s; report: {report}"
          + (f" and {args.report}" if args.report else ""), flush=True)
    print("[table3] rows: " + "; ".join(f"<name>{suffix} = {meaning}" for suffix, meaning in ROW_NAMES.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
