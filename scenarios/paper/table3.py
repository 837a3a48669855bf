"""Paper table 3 at its real size on one GPU: HDC-FL on
scenarios/paper/c10-rot-no-pretrain.yaml (CIFAR-10, 20 clients of 2,500 images in four
rotation groups, ResNet-18 from its seeded initialisation, 100 rounds, its refresh
cache), the table's two other rows replayed from that run's saved refreshes (no
prototype: lambda = 0, the global encoder; one prototype: G = 1), and the table-3
report over the run and its replays.

    python scenarios/paper/table3.py --cifar PATH [--seeds 42] [--out DIR] [--budget 570]
    python scenarios/paper/table3.py --dry-run             # anywhere: the same commands, tiny, on the CPU

PATH is a CIFAR-10 Parquet folder (train.parquet, test.parquet; scripts/cifar10_to_parquet.py
writes one), else $HDCFL_CIFAR10_PARQUET. The runs go under --out (default $OUT/table3
when $OUT is set, else runs/table3). The layout: the local backend (no Ray) with one
GPU share per host, so one client host per visible GPU holds every client of it and a
round's 10 participants train as one batched model (the CUDA default); the command
prints it.

A seed of 100 rounds does not fit one GPU command at the paper's round time (at 13-14 s
a round, 100 rounds take about 23 minutes against a command's 9-10): the run checkpoints
every round, and when --budget runs out it is stopped resumably (as Ctrl-C stops it);
the same command, run again, resumes it where it stopped. After each round time it has
measured, the command prints how many commands the table takes at that rate, and it
exits 3 when it stopped a run at the budget (0 when the report is written). Replays
and the report come once the run is finished; a finished seed is reused.

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
# the run's --set values besides the data path: the local backend with one host per GPU holding its
# clients (a round's participants train as one batched model), a checkpoint every round (a run
# stopped at the budget loses nothing)
RUN_SETS = ["dataset.name=parquet_images", "runtime.backend=local", "runtime.num_gpus_per_actor=1", "checkpoint.every=1"]
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


def run_until(command: list[str], deadline: float) -> tuple[str, float]:
    """Run a step until it ends or `deadline` (time.perf_counter()) passes; then stop it
    as Ctrl-C does (resumably) and wait for it. ("finished" | "stopped", seconds); exits
    with the step's code when it fails."""
    import signal

    print(f"[table3] {' '.join(command)}", flush=True)
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=REPO, start_new_session=True)
    while process.poll() is None:
        if time.perf_counter() >= deadline:
            os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            return "stopped", time.perf_counter() - started
        time.sleep(0.5)
    if process.returncode != 0:
        print(f"[table3] error: the command above exited {process.returncode}", file=sys.stderr)
        sys.exit(process.returncode)
    return "finished", time.perf_counter() - started


def rounds_done(run_dir: Path) -> tuple[int, float | None]:
    """The rounds a run has logged and their mean wall time (None before the first)."""
    import pyarrow.parquet as pq

    path = run_dir / "rounds.parquet"
    if not path.exists():
        return 0, None
    seconds = pq.read_table(path, columns=["wall_time_s"]).column("wall_time_s").to_pylist()
    return len(seconds), (sum(seconds) / len(seconds) if seconds else None)


def commands_needed(rounds: int, round_s: float, budget_s: float, start_up_s: float = 60.0) -> int:
    """GPU commands of `budget_s` seconds a run of `rounds` rounds takes at `round_s` a round,
    each command paying `start_up_s` (loading the data, starting the hosts) before its rounds."""
    per_command = max(1, int((budget_s - start_up_s) // round_s))
    return -(-rounds // per_command)


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


def total_rounds(run_dir: Path) -> int:
    import yaml

    return int(yaml.safe_load((run_dir / "scenario.yaml").read_text())["protocol"]["rounds"])


def layout_text(dry_run: bool) -> str:
    """Where the clients train, as the run will lay them out."""
    if dry_run:
        return "the CPU (dry run): the local backend's hosts, one client at a time"
    try:
        import torch

        gpus = torch.cuda.device_count()
    except ImportError:
        gpus = 0
    return (f"the local backend, one client host per visible GPU ({gpus}) holding all its clients: a round's participants "
            "train as one batched model (runtime.batched_training, on by default on CUDA)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cifar", default=os.environ.get("HDCFL_CIFAR10_PARQUET"), help="the CIFAR-10 Parquet folder")
    parser.add_argument("--seeds", default="42", help="comma-separated seeds (the paper's: 42,123,2026)")
    default_out = Path(os.environ["OUT"]) / "table3" if os.environ.get("OUT") else REPO / "runs/table3"
    parser.add_argument("--out", type=Path, default=default_out, help="folder for the runs, replays and report")
    parser.add_argument("--report", type=Path, default=None, help="also write the report here")
    parser.add_argument("--budget", type=float, default=570.0,
                        help="seconds for this command; a run still going then is stopped resumably (exit 3: run the command again)")
    parser.add_argument("--dry-run", action="store_true", help="tiny, on the CPU: checks the commands without a GPU")
    args = parser.parse_args(argv)
    try:
        seeds = [int(seed) for seed in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds: {args.seeds!r} is not a comma-separated list of integers")
    began = time.perf_counter()
    sets = list(RUN_SETS)
    if args.dry_run:
        args.cifar = str(write_tiny_parquet(args.out / "tiny-parquet"))
        sets += DRY_RUN_SETS
    if not args.cifar or not (Path(args.cifar) / "train.parquet").is_file():
        print(f"error: no CIFAR-10 Parquet folder ({args.cifar!r}): pass --cifar PATH or set HDCFL_CIFAR10_PARQUET "
              "(python scripts/cifar10_to_parquet.py writes one)", file=sys.stderr)
        return 2
    sets.append(f"dataset.path={Path(args.cifar).resolve()}")
    run(cli() + ["validate", str(SCENARIO), *[arg for value in sets for arg in ("--set", value)]])
    print(f"[table3] layout: {layout_text(args.dry_run)}", flush=True)

    runs, replays = [], []
    for seed in seeds:
        run_dir = args.out / "hdcfl" / f"seed{seed}"
        targets = {name: args.out / "replays" / name / f"seed{seed}" for name in REPLAYS}
        if not finished(run_dir):
            if (run_dir / "manifest.json").is_file():  # stopped by an earlier command's budget: go on
                command = cli() + ["simulate", "--resume", str(run_dir), "--quiet"]
            else:
                command = cli() + ["simulate", str(SCENARIO), *[arg for value in [*sets, f"seed={seed}"] for arg in ("--set", value)],
                                   "--out", str(run_dir), "--quiet"]
            outcome, _ = run_until(command, began + args.budget)
            done_rounds, round_s = rounds_done(run_dir)
            total = total_rounds(run_dir)
            if round_s is not None:
                print(f"[table3] seed {seed}: {done_rounds} of {total} rounds, {round_s:.1f} s a round: a seed takes "
                      f"{commands_needed(total, round_s, args.budget)} command(s) of {args.budget:.0f} s", flush=True)
            if outcome == "stopped":
                print(f"[table3] seed {seed} stopped at the budget after round {done_rounds}; run the same command again "
                      "to resume it", flush=True)
                return 3
        for name, change in REPLAYS.items():
            if not finished(targets[name]):
                run(cli() + ["ablate", str(run_dir), "--set", f"algorithm.hdcfl.{change}", "--out", str(targets[name])])
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
