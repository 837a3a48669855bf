"""Do two versions of the code give the same per-client metrics?

Runs a scenario with each method at each seed on two git revisions (each checked
out into a temporary worktree and run with its own code on the path), then
compares the clients tables bit for bit (every column but the host that held a
client) and prints, per method, whether they are identical and the final mean
accuracy of both, so a change that is meant to move results (a new seed stream)
can be judged against the seed spread.

    python -m benchmarks.same_results --before 0f76479 --after HEAD \\
        --scenario scenarios/quickstart.yaml --algorithms all --seeds 42 --set protocol.rounds=10

`--after WORKTREE` (the default) runs the working tree as it is. Runs use the
local backend with one torch thread, so both sides do the same arithmetic. Each
side reads the scenario file as its own revision has it: pin a key that changed
between them with --set (e.g. a calibration), so both run the same setting.
"""

from __future__ import annotations

import argparse
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
IGNORED_COLUMNS = {"host"}  # which actor held a client is not a result
DATA_PATH_VARIABLES = ("HDCFL_CIFAR10_PARQUET",)  # the scenarios' ${...} data paths


def checkout(revision: str, into: Path) -> Path:
    if revision == "WORKTREE":
        return REPO
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(into), revision], check=True, capture_output=True)
    return into


def run(code: Path, scenario: Path, algorithm: str, seed: int, overrides: list[str], out: Path) -> Path:
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1"}
    # Each side runs in its own worktree: a data path relative to here must still find the data.
    for name in DATA_PATH_VARIABLES:
        if env.get(name):
            env[name] = str(Path(env[name]).resolve())
    command = [sys.executable, "-c", "from cli import app; app()", "simulate", str(scenario), "--quiet", "--out", str(out)]
    for override in [f"algorithm.name={algorithm}", f"seed={seed}", "runtime.backend=local", "runtime.num_cpus=1", *overrides]:
        command += ["--set", override]
    finished = subprocess.run(command, cwd=code, env=env, capture_output=True, text=True)
    if finished.returncode != 0:
        raise SystemExit(f"{algorithm} seed {seed} failed on {code}:\n{finished.stderr.strip()}")
    return out


def clients(run_dir: Path) -> Any:
    return pq.read_table(run_dir / "clients.parquet").sort_by([("round", "ascending"), ("client_id", "ascending")])


def bits(values: list[Any]) -> list[Any]:
    return [struct.pack("<d", v) if isinstance(v, float) else (bits(v) if isinstance(v, list) else v) for v in values]


def differing_columns(a: Any, b: Any) -> list[str]:
    """The clients-table columns whose values differ in any bit (all of them if the row counts differ)."""
    columns = [c for c in a.column_names if c not in IGNORED_COLUMNS]
    if a.num_rows != b.num_rows:
        return columns
    return [c for c in columns if c not in b.column_names or bits(a.column(c).to_pylist()) != bits(b.column(c).to_pylist())]


def final_mean(table: Any) -> float:
    last = max(table.column("round").to_pylist())
    values = [a for r, a in zip(table.column("round").to_pylist(), table.column("accuracy").to_pylist()) if r == last]
    return 100.0 * sum(values) / len(values)


def method_names(code: Path) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(code)}
    try:
        listing = "from hdcfl_ray.algorithms.registry import method_names; print(','.join(method_names()))"
        output = subprocess.run([sys.executable, "-c", listing], check=True, cwd=code, env=env, capture_output=True, text=True)
    except subprocess.CalledProcessError:  # before methods declared themselves
        listing = "from hdcfl_ray.config.schema import ALGORITHM_NAMES; print(','.join(ALGORITHM_NAMES))"
        output = subprocess.run([sys.executable, "-c", listing], check=True, cwd=code, env=env, capture_output=True, text=True)
    return output.stdout.strip().split(",")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="git revision of the reference code")
    parser.add_argument("--after", default="WORKTREE", help="git revision, or WORKTREE (default: the working tree)")
    parser.add_argument("--scenario", type=Path, default=Path("scenarios/quickstart.yaml"), help="relative to the repository")
    parser.add_argument("--algorithms", default="all", help="comma-separated, or all (the methods both revisions have)")
    parser.add_argument("--seeds", default="42")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    seeds = [int(seed) for seed in args.seeds.split(",")]
    with tempfile.TemporaryDirectory(prefix="same-results-") as temporary:
        root = Path(temporary)
        before, after = checkout(args.before, root / "before"), checkout(args.after, root / "after")
        try:
            if args.algorithms == "all":
                algorithms = [name for name in method_names(before) if name in set(method_names(after))]
            else:
                algorithms = args.algorithms.split(",")
            print(f"{args.scenario} {' '.join(args.overrides)}: {args.before} vs {args.after}")
            print(f"{'method':<10} {'seed':>6} {'identical':>9} {'before %':>9} {'after %':>9}")
            runs_differing = 0
            for algorithm in algorithms:
                for seed in seeds:
                    tables = [
                        clients(run(code, args.scenario, algorithm, seed, args.overrides, root / f"{side}-{algorithm}-{seed}"))
                        for side, code in (("before", before), ("after", after))
                    ]
                    columns = differing_columns(*tables)
                    same = not columns
                    runs_differing += not same
                    where = "" if same else "  differ: " + ", ".join(columns)
                    print(f"{algorithm:<10} {seed:>6} {'yes' if same else 'NO':>9} {final_mean(tables[0]):>9.2f} {final_mean(tables[1]):>9.2f}{where}")
                    sys.stdout.flush()
        finally:
            for side in (before, after):
                if side != REPO:
                    subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(side)], capture_output=True)
    return 1 if runs_differing else 0


if __name__ == "__main__":
    raise SystemExit(main())
