"""Mixed precision, memory layout and batched training: wall time and final accuracy per variant, over seeds.

Each (variant, seed) runs `hdcfl-ray simulate` as a fresh process, one after the
other; the table gives per variant the median wall time, its ratio to fp32's,
and the final mean client accuracy (mean +- std over the seeds, and per seed),
so an accuracy effect can be read against fp32's seed spread.

    python -m benchmarks.precision                                   # quickstart, seeds 42 123 2026
    python -m benchmarks.precision --scenario scenarios/cpu/cpu-c10-ls3.yaml \\
        --set algorithm.name=hdcfl --out docs/benchmarks.md            # needs HDCFL_CIFAR10_PARQUET
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks._common import (
    append_markdown,
    machine_description,
    print_table,
    run_measured,
)
from hdcfl_ray.logs.table_writer import read_table

REPO = Path(__file__).resolve().parents[1]

VARIANTS: dict[str, list[str]] = {
    "fp32": ["runtime.precision=fp32"],
    "bf16": ["runtime.precision=bf16"],
    "fp32+channels_last": ["runtime.precision=fp32", "runtime.channels_last=true"],
    "bf16+channels_last": ["runtime.precision=bf16", "runtime.channels_last=true"],
    # runtime.batched_training on the CPU (off there by default): a round's clients trained as one batched model
    "fp32+batched": ["runtime.precision=fp32", "runtime.batched_training=true"],
}


def run_once(scenario: Path, seed: int, overrides: list[str], out_dir: Path) -> tuple[float, float]:
    cmd = [str(Path(sys.executable).with_name("hdcfl-ray")), "simulate", str(scenario), "--quiet",
           "--set", f"seed={seed}", "--set", f"output.dir={out_dir}"]
    for override in overrides:
        cmd += ["--set", override]
    measured = run_measured(cmd, cwd=REPO)
    if measured.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{measured.stderr[-3000:]}")
    run_dir = next(out_dir.iterdir())
    rounds = read_table(run_dir, "rounds").sort_by("round").to_pydict()
    return measured.wall_s, 100.0 * rounds["mean_accuracy"][-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", type=Path, default=REPO / "scenarios/quickstart.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 123, 2026])
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS)[:4])
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for variant in args.variants:
            results[variant] = []
            for seed in args.seeds:
                out_dir = Path(tmp) / f"{variant}-{seed}"
                wall, accuracy = run_once(args.scenario, seed, args.overrides + VARIANTS[variant], out_dir)
                results[variant].append((wall, accuracy))
                print(f"{variant} seed {seed}: {wall:.1f} s, final mean {accuracy:.2f}%", flush=True)
    base = statistics.median(w for w, _ in results[args.variants[0]])
    rows = []
    for variant, runs in results.items():
        walls, accuracies = [w for w, _ in runs], [a for _, a in runs]
        rows.append({
            "variant": variant,
            "median wall s": round(statistics.median(walls), 1),
            f"time / {args.variants[0]}": round(statistics.median(walls) / base, 2),
            "final mean acc %": f"{statistics.mean(accuracies):.2f} +- {statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0:.2f}",
            "per seed": " / ".join(f"{a:.2f}" for a in accuracies),
        })
    print_table(rows)
    if args.out:
        sets = "".join(f" --set {o}" for o in args.overrides)
        append_markdown(
            args.out,
            f"Mixed precision and memory layout: {args.scenario.name}{sets}, seeds {' '.join(map(str, args.seeds))}",
            f"python -m benchmarks.precision --scenario {args.scenario.relative_to(REPO) if args.scenario.is_absolute() else args.scenario}{sets}",
            machine_description(),
            rows,
        )


if __name__ == "__main__":
    main()
