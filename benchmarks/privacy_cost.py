"""What client-level differential privacy (a `privacy:` section, docs/privacy.md) adds to a
round: the same 1,000-client run of FedAvg and of FedAvg-SE without privacy and with
`privacy: {noise_multiplier: 1.0, clip: 1.0, sampling: fixed}` (the clients clip their
updates, the server adds Gaussian noise to their sum, the accountant counts the release),
everything else equal (scenario, seed, backend), each a fresh `hdcfl-ray simulate`
process, taking turns so a slow spell of the machine hits every side, medians over the
repeats. Fixed sampling trains the same clients as the plain run (protocol.participation's
sample); the `poisson` variant trains a random number of clients a round, each joining
with rate q = participation (at the default participation 1.0, q = 1: every client, the
same count, so it measures the Poisson code path, not a smaller round). Reported per
method: the round's wall time (rounds.parquet `wall_time_s`, the mean of the rounds after
the first), the server's aggregation time (`aggregate_s`), the ratio private / plain of
the medians and the range of the ratios of the repeats' pairs; and, apart from the runs,
the mechanism alone timed in-process (hdcfl_ray.privacy's `clip_parts` on one update of
the model's size per client, then one `private_mean`, the noised sum over the cohort) as
a share of the plain run's round.

    python -m benchmarks.privacy_cost [--clients 1000] [--rounds 3] [--repeats 3] [--variants fixed poisson] [--out docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks._common import append_markdown, machine_description, print_table, run_measured
from benchmarks.scale import scenario as scale_scenario
from hdcfl_ray.logs.table_writer import read_table

REPO = Path(__file__).resolve().parents[1]
METHODS = ("fedavg", "fedavg_se")
VARIANTS = ("fixed", "poisson")
NOISE_MULTIPLIER = 1.0
CLIP = 1.0
SAMPLES_PER_CLIENT = 2  # server_optimizer_cost's workload: the server's share of a round is largest
MECHANISM_REPEATS = 5


def privacy_section(sampling: str) -> dict[str, Any]:
    """The scenario's privacy section: z and C given, so no target epsilon is needed."""
    return {"noise_multiplier": NOISE_MULTIPLIER, "clip": CLIP, "sampling": sampling}


def build_scenario(clients: int, rounds: int, participation: float, method: str, variant: str, out_dir: Path) -> dict[str, Any]:
    """The benchmark's scenario: benchmarks/scale.py's (synthetic 16x16, rotation groups, the
    small CNN, local backend) with `method`, and a privacy section unless `variant` is plain."""
    data = scale_scenario(clients, SAMPLES_PER_CLIENT, "local", out_dir)
    data["name"] = f"privacy-cost-{method}-{variant}"
    data["algorithm"] = {"name": method}
    data["protocol"]["rounds"] = rounds
    data["protocol"]["participation"] = participation
    if variant != "plain":
        data["privacy"] = privacy_section(variant)
    return data


def _run(clients: int, rounds: int, participation: float, method: str, variant: str, work: Path, attempt: int) -> dict[str, float]:
    out_dir = work / f"{method}-{variant}-{attempt}"
    path = work / f"{method}-{variant}-{attempt}.yaml"
    path.write_text(yaml.safe_dump(build_scenario(clients, rounds, participation, method, variant, out_dir), sort_keys=False))
    measured = run_measured([str(Path(sys.executable).with_name("hdcfl-ray")), "simulate", str(path), "--quiet"], cwd=REPO)
    if measured.returncode != 0:
        raise SystemExit(f"{method} ({variant}) failed (exit {measured.returncode}):\n{measured.stderr[-3000:]}")
    table = read_table(next(out_dir.iterdir()), "rounds").sort_by("round").to_pydict()
    kept = slice(1, None) if len(table["round"]) > 1 else slice(None)  # round 1 pays for warm-up
    return {
        "round_s": statistics.mean(table["wall_time_s"][kept]),
        "aggregate_s": statistics.mean(table["aggregate_s"][kept]),
        "participants": statistics.mean(table["num_participants"][kept]),
        "epsilon": table["epsilon"][-1],
        "run_s": measured.wall_s,
    }


def model_sizes() -> tuple[int, int]:
    """(encoder values, head values) of the benchmark scenario's model."""
    from hdcfl_ray.config.schema import ModelConfig
    from hdcfl_ray.models.split_model import build_split_model

    probe = scale_scenario(1, SAMPLES_PER_CLIENT, "local", Path("unused"))
    model = build_split_model(ModelConfig(**probe["model"]), probe["dataset"]["channels"], probe["dataset"]["num_classes"], seed=0)
    return sum(p.numel() for p in model.encoder.parameters()), sum(p.numel() for p in model.head.parameters())


def mechanism_seconds(clients: int, encoder_values: int, head_values: int, repeats: int = MECHANISM_REPEATS,
                      blas_threads: int | None = None) -> dict[str, float]:
    """The mechanism alone, in this process: `clip_parts` on `clients` updates of the shared
    parts' sizes (head_values 0: the encoder alone, FedAvg-SE), each longer than the clip
    (the scaling path), then one `private_mean` of the flattened clipped updates (the
    noised sum over the cohort, as the server's `released_mean`). Medians over `repeats`.
    `blas_threads`: numpy's BLAS limited to that many threads while timing (threadpoolctl;
    `clip_parts`' norm is a BLAS dot), None as the process has it."""
    import contextlib

    import numpy as np

    from hdcfl_ray.privacy.clipping import clip_parts
    from hdcfl_ray.privacy.gaussian_sum import private_mean

    rng = np.random.default_rng(0)
    shapes = [encoder_values] + ([head_values] if head_values else [])
    # norm about 0.05 sqrt(values), over C = 1 for any model of more than 400 values
    updates = [[(0.05 * rng.standard_normal(size)).astype(np.float32) for size in shapes] for _ in range(clients)]
    clip_times, sum_times = [], []
    limit: Any = contextlib.nullcontext()
    if blas_threads is not None:
        from threadpoolctl import threadpool_limits

        limit = threadpool_limits(limits=blas_threads, user_api="blas")
    with limit:
        for repeat in range(repeats):
            started = time.perf_counter()
            clipped = [clip_parts(parts, CLIP)[0] for parts in updates]
            clip_times.append(time.perf_counter() - started)
            started = time.perf_counter()
            vectors = [parts[0] if len(parts) == 1 else np.concatenate(parts) for parts in clipped]
            private_mean(vectors, CLIP, NOISE_MULTIPLIER, float(clients), np.random.default_rng(repeat), size=sum(shapes))
            sum_times.append(time.perf_counter() - started)
    return {"clip_s": statistics.median(clip_times), "sum_s": statistics.median(sum_times)}


def require_opacus() -> None:
    """Stop before any run when the accountant's Opacus (the `dp` extra) is missing: every
    private run would stop with exit 2 for it."""
    from hdcfl_ray.privacy.opacus_extra import PrivacyExtraMissing, opacus_accountants

    try:
        opacus_accountants()
    except PrivacyExtraMissing as error:
        raise SystemExit(f"benchmarks.privacy_cost: the private runs need the dp extra. {error}") from None


def _median(records: list[dict[str, float]], key: str) -> float:
    return statistics.median(record[key] for record in records)


def summarise(measured: dict[tuple[str, str], list[dict[str, float]]], mechanism: dict[str, dict[str, float]],
              methods: list[str], variants: list[str]) -> list[dict[str, Any]]:
    """One row per method and side: medians, ratios against the same method's plain runs."""
    rows = []
    for method in methods:
        plain = measured[(method, "plain")]
        plain_round = _median(plain, "round_s")
        plain_spread = max(r["round_s"] for r in plain) - min(r["round_s"] for r in plain)
        for variant in ("plain", *variants):
            records = measured[(method, variant)]
            round_s = _median(records, "round_s")
            pairs = [r["round_s"] / p["round_s"] for r, p in zip(records, plain)]
            row: dict[str, Any] = {
                "method": method,
                "privacy": "none" if variant == "plain" else f"{variant}, z {NOISE_MULTIPLIER:g}, C {CLIP:g}",
                "clients / round": round(_median(records, "participants"), 1),
                "round s": round(round_s, 3),
                "vs plain": round(round_s / plain_round, 3),
                "pairs' ratios": "-" if variant == "plain" else f"{min(pairs):.3f}-{max(pairs):.3f}",
                "plain's spread": f"{plain_spread / plain_round:.1%}",
                "aggregate s": round(_median(records, "aggregate_s"), 4),
                "mechanism s": None,
                "mechanism / round": None,
                "1 BLAS thread s": None,
                "processes": len(records),
            }
            if variant != "plain":
                seconds = mechanism[method]["clip_s"] + mechanism[method]["sum_s"]
                row["mechanism s"] = round(seconds, 4)
                row["mechanism / round"] = f"{seconds / plain_round:.1%}"
                if f"{method} 1 thread" in mechanism:
                    one = mechanism[f"{method} 1 thread"]
                    row["1 BLAS thread s"] = round(one["clip_s"] + one["sum_s"], 4)
            rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3, help="rounds per run; the rounds after the first are measured")
    parser.add_argument("--participation", type=float, default=1.0, help="protocol.participation (Poisson's q)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--variants", nargs="*", choices=VARIANTS, default=list(VARIANTS), help="the private sides (each against plain)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.variants:
        require_opacus()
    began = time.perf_counter()
    sides = [(method, variant) for method in args.methods for variant in ("plain", *args.variants)]
    measured: dict[tuple[str, str], list[dict[str, float]]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory(prefix="privacy-cost-") as scratch:
        for attempt in range(args.repeats):
            for method, variant in sides:
                measured[(method, variant)].append(_run(args.clients, args.rounds, args.participation, method, variant, Path(scratch), attempt))
    encoder_values, head_values = model_sizes()
    cohort = round(args.clients * args.participation)
    mechanism: dict[str, dict[str, float]] = {}
    for method in args.methods:
        head = head_values if method == "fedavg" else 0  # FedAvg-SE shares the encoder alone
        mechanism[method] = mechanism_seconds(cohort, encoder_values, head)
        try:
            mechanism[f"{method} 1 thread"] = mechanism_seconds(cohort, encoder_values, head, blas_threads=1)
        except ImportError:  # no threadpoolctl: the column stays empty
            pass
    rows = summarise(measured, mechanism, args.methods, args.variants)
    print_table(rows)
    for name, seconds in mechanism.items():
        print(f"{name}: the mechanism alone at {cohort} clients: clipping {seconds['clip_s']:.4f} s, noised mean {seconds['sum_s']:.4f} s")
    print(f"{len(sides) * args.repeats} processes in {time.perf_counter() - began:.0f} s")
    if args.out:
        command = (f"python -m benchmarks.privacy_cost --clients {args.clients} --rounds {args.rounds} "
                   f"--participation {args.participation:g} --repeats {args.repeats} --methods {' '.join(args.methods)} "
                   f"--variants {' '.join(args.variants)}")
        append_markdown(args.out, f"Client-level DP's cost at {args.clients} clients (small CNN, z {NOISE_MULTIPLIER:g}, C {CLIP:g})",
                        command, machine_description(), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
