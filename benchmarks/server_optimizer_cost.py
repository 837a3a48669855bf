"""What a server optimiser (protocol.server_optimizer) adds to a round: the same
1,000-client FedAvg run with the default server (the clients' mean) and with each
adaptive rule, each a fresh `hdcfl-ray simulate` process, alternated so a slow
spell of the machine hits every rule, medians over the repeats. Reported: the
server's aggregation time per round (rounds.parquet `aggregate_s`, the mean of
rounds 2 and 3) and the round's wall time; and, apart from the runs, one server
step on a ResNet-18 encoder's 11.2 M values (the largest shared model shipped).

    python -m benchmarks.server_optimizer_cost [--clients 1000] [--repeats 3] [--out docs/benchmarks.md]
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
RULES = ("sgd", "adam", "yogi", "adagrad", "avgm")
RESNET18_ENCODER_VALUES = 11_173_962


def _run(clients: int, rule: str, work: Path, attempt: int) -> dict[str, float]:
    out_dir = work / f"{rule}-{attempt}"
    data = scale_scenario(clients, 2, "local", out_dir)
    data["algorithm"] = {"name": "fedavg"}
    data["name"] = f"server-optimizer-{rule}"
    optimizer: dict[str, Any] = {"name": rule}
    if rule == "avgm":
        optimizer["momentum"] = 0.9
    elif rule != "sgd":
        optimizer["lr"] = 0.1
    data["protocol"]["server_optimizer"] = optimizer
    path = work / f"{rule}-{attempt}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    measured = run_measured([str(Path(sys.executable).with_name("hdcfl-ray")), "simulate", str(path), "--quiet"], cwd=REPO)
    if measured.returncode != 0:
        raise SystemExit(f"{rule} failed:\n{measured.stderr[-3000:]}")
    rounds = read_table(next(out_dir.iterdir()), "rounds").sort_by("round").to_pydict()
    return {"aggregate_s": statistics.mean(rounds["aggregate_s"][1:]), "round_s": statistics.mean(rounds["wall_time_s"][1:])}


def _resnet_step_seconds(rule: str, repeats: int = 3) -> float:
    import numpy as np

    from hdcfl_ray.contract import ServerOptimizerConfig
    from hdcfl_ray.maths.server_optimizer import Moments, step_vector

    rng = np.random.default_rng(0)
    current = rng.standard_normal(RESNET18_ENCODER_VALUES, dtype=np.float32)
    mean = current + 0.01 * rng.standard_normal(RESNET18_ENCODER_VALUES, dtype=np.float32)
    config = ServerOptimizerConfig(name=rule, lr=0.1) if rule != "sgd" else ServerOptimizerConfig()
    moments, times = Moments(), []
    for _ in range(repeats + 1):  # the first step allocates the moments
        started = time.perf_counter()
        _, moments = step_vector(config, moments, current, mean)
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    measured: dict[str, list[dict[str, float]]] = {rule: [] for rule in RULES}
    with tempfile.TemporaryDirectory(prefix="server-optimizer-") as scratch:
        for attempt in range(args.repeats):
            for rule in RULES:
                measured[rule].append(_run(args.clients, rule, Path(scratch), attempt))
    base_aggregate = statistics.median(record["aggregate_s"] for record in measured["sgd"])
    base_round = statistics.median(record["round_s"] for record in measured["sgd"])
    rows = []
    for rule, records in measured.items():
        aggregate = statistics.median(record["aggregate_s"] for record in records)
        round_s = statistics.median(record["round_s"] for record in records)
        spread = max(record["round_s"] for record in measured["sgd"]) - min(record["round_s"] for record in measured["sgd"])
        rows.append({
            "server": "default (sgd, lr 1)" if rule == "sgd" else rule,
            "aggregate s": round(aggregate, 4),
            "+ vs default s": round(aggregate - base_aggregate, 4),
            "round s": round(round_s, 3),
            "round vs default": round(round_s / base_round, 3),
            "default's round spread s": round(spread, 3),
            "ResNet-18 step s": round(_resnet_step_seconds(rule), 3),
            "processes": len(records),
        })
    print_table(rows)
    if args.out:
        command = f"python -m benchmarks.server_optimizer_cost --clients {args.clients} --repeats {args.repeats}"
        append_markdown(args.out, f"A server optimiser's cost at {args.clients} clients (FedAvg, small CNN)", command, machine_description(), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
