"""A run beside other busy processes: how much slower than alone, per thread setting.

Runs the quickstart (digits, 10 rounds by default, local backend) as a fresh
`hdcfl-ray simulate` process, alone and beside `--busy` CPU-bound processes (one
spinning Python loop each, what a second simulation or a data job looks like to
the scheduler), for each setting of torch threads and OpenMP waiting given. It
reports the median wall time of `--repeats` fresh processes and the ratio to the
same setting alone. A run whose T threads could use T of the C cores alone
gets about C / (T + busy) cores beside `busy` CPU-bound processes, so its
fair-share slowdown is (T + busy) / C when T <= C (2.0 for the default on two
cores beside two busy processes, 1.5 for one thread).

    python -m benchmarks.busy_machine                          # 2 busy, 3 repeats
    python -m benchmarks.busy_machine --busy 2 --repeats 5 --out docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
from pathlib import Path

from benchmarks._common import (
    append_markdown,
    machine_description,
    print_table,
    run_measured,
)

REPO = Path(__file__).resolve().parents[1]

CORES = os.cpu_count() or 1
# (label, environment additions, --set overrides)
SETTINGS: dict[str, tuple[dict[str, str], list[str]]] = {
    "default (a host per core on its own thread, 1 torch thread each)": ({}, []),
    "one host, 1 torch thread (runtime.num_cpus=1)": ({}, ["runtime.num_cpus=1"]),
    f"{CORES} threads, OpenMP's own waiting (spin, then sleep)": ({}, [f"runtime.torch_threads={CORES}"]),
    f"{CORES} threads, passive OpenMP waiting": ({"OMP_WAIT_POLICY": "PASSIVE"}, [f"runtime.torch_threads={CORES}"]),
    f"{CORES} threads, spin 10k then sleep": ({"GOMP_SPINCOUNT": "10000"}, [f"runtime.torch_threads={CORES}"]),
}


def spin() -> None:  # a CPU-bound neighbour
    while True:
        pass


def simulate(rounds: int, out_dir: Path, env_extra: dict[str, str], overrides: list[str]) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(env_extra)
    cmd = [str(Path(sys.executable).with_name("hdcfl-ray")), "simulate", str(REPO / "scenarios/quickstart.yaml"),
           "--set", f"protocol.rounds={rounds}", "--set", "runtime.backend=local", "--set", f"output.dir={out_dir}", "--quiet"]
    for override in overrides:
        cmd += ["--set", override]
    measured = run_measured(cmd, env=env, cwd=REPO)
    if measured.returncode != 0:
        raise SystemExit(f"simulate failed ({measured.returncode}): {measured.stderr[-2000:]}")
    return measured.wall_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--busy", type=int, default=2, help="CPU-bound neighbours (default 2)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per cell; the median is reported")
    parser.add_argument("--settings", nargs="*", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--out", type=Path, help="append the table to this markdown file")
    args = parser.parse_args()

    import tempfile

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label in args.settings:
            env_extra, overrides = SETTINGS[label]
            times: dict[str, float] = {}
            for busy in (0, args.busy):
                neighbours = [multiprocessing.Process(target=spin, daemon=True) for _ in range(busy)]
                for process in neighbours:
                    process.start()
                try:
                    walls = [simulate(args.rounds, Path(tmp) / f"r{busy}-{i}", env_extra, overrides) for i in range(args.repeats)]
                finally:
                    for process in neighbours:
                        process.kill()
                        process.join()
                times[str(busy)] = statistics.median(walls)
                print(f"{label}, {busy} busy: {', '.join(f'{w:.1f}' for w in walls)} s", flush=True)
            rows.append({
                "setting": label,
                "alone s": round(times["0"], 1),
                f"beside {args.busy} busy s": round(times[str(args.busy)], 1),
                "ratio": round(times[str(args.busy)] / times["0"], 2),
            })
    print_table(rows)
    if args.out:
        append_markdown(
            args.out,
            f"A run beside {args.busy} CPU-bound processes (quickstart, {args.rounds} rounds, local backend, "
            f"median of {args.repeats} fresh processes; ratio = beside / alone)",
            f"python -m benchmarks.busy_machine --busy {args.busy} --rounds {args.rounds} --repeats {args.repeats}",
            machine_description(),
            rows,
        )


if __name__ == "__main__":
    main()
