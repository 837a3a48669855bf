"""Every case of the GPU smoke suite (tests/test_cuda_smoke.py: each method x small CNN and
ResNet-18, two rounds on synthetic data, four Ray hosts) run once on one device, several
cases at a time, each worker process with its own private Ray instance; then two such
files compared case by case. A quick look at GPU-against-CPU agreement for every method
when the whole suite (three runs a case) does not fit the time a GPU is lent:

    python -m benchmarks.cuda_agreement run --gpus 0.25 --workers 4 --budget 125 --out gpu.jsonl
    python -m benchmarks.cuda_agreement run --gpus 0 --workers 2 --out cpu.jsonl [--cases hdcfl:small_cnn,...]
    python -m benchmarks.cuda_agreement compare gpu.jsonl cpu.jsonl

`run` writes one JSON line per case as it finishes (round-1 and round-2 mean accuracy and
loss, the hosts' devices, seconds), and runs the cases named by --twice a second time to
check the two runs' clients tables are equal. No case starts after --budget seconds (those
are written as not started). `compare` prints a Markdown table of the round-1 differences
against the suite's tolerances (10 accuracy points, 20% of the loss).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

DEFAULT_TWICE = "ditto:resnet18_cifar,hdcfl:resnet18_cifar,fedavg:resnet18_cifar"


def all_cases() -> list[str]:
    from hdcfl_ray.algorithms.registry import method_names

    return [f"{method}:{encoder}" for encoder in ("resnet18_cifar", "small_cnn") for method in method_names()]


def run_one(case: str, gpus: float, twice: bool) -> dict[str, Any]:
    from tests.test_cuda_smoke import _means, _run

    method, encoder = case.split(":")
    record: dict[str, Any] = {"case": case}
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as work:
            rows, manifest = _run(method, encoder, gpus, Path(work) / "first")
            record.update(round1=_means(rows, 1), round2=_means(rows, 2),
                          devices=sorted({host["device"] for host in manifest["client_host_hardware"]}))
            if twice:
                again, _ = _run(method, encoder, gpus, Path(work) / "second")
                record["identical"] = again == rows
    except Exception:  # recorded, and the next case runs
        record["error"] = traceback.format_exc()[-3000:]
    record["seconds"] = round(time.perf_counter() - started, 1)
    return record


def worker(cases: list[str], gpus: float, out: str, deadline: float, twice: list[str], cpus: int) -> None:
    import ray

    from hdcfl_ray.runtime.backends.ray_session import start_private_ray

    start_private_ray(num_cpus=cpus)
    try:
        with open(out, "a") as file:
            for case in cases:
                record = ({"case": case, "not_started": "past the budget"} if time.time() > deadline
                          else run_one(case, gpus, case in twice))
                file.write(json.dumps(record) + "\n")
                file.flush()
    finally:
        ray.shutdown()


def run(args: argparse.Namespace) -> int:
    cases = args.cases.split(",") if args.cases else all_cases()
    unknown = sorted(set(cases) - set(all_cases()))
    if unknown:
        print(f"error: unknown case(s) {unknown}; a case is METHOD:ENCODER, e.g. hdcfl:small_cnn", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("")
    deadline = time.time() + args.budget
    config = {"gpus": args.gpus, "out": str(out.resolve()), "deadline": deadline, "twice": args.twice.split(",") if args.twice else [], "cpus": args.cpus}
    workers = [subprocess.Popen([sys.executable, "-m", "benchmarks.cuda_agreement", "_worker", json.dumps({**config, "cases": cases[i::args.workers]})],
                                cwd=REPO, stdout=subprocess.DEVNULL, stderr=open(f"{out}.worker{i}.log", "w"))
               for i in range(min(args.workers, len(cases)))]
    for process in workers:
        try:
            process.wait(timeout=max(1.0, deadline + args.grace - time.time()))
        except subprocess.TimeoutExpired:
            process.kill()
    records = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    failed = [record["case"] for record in records if "error" in record]
    print(f"{len(records)} of {len(cases)} cases written to {out}; errors: {failed or 'none'}")
    return 1 if failed else 0


def compare(args: argparse.Namespace) -> int:
    from tests.test_cuda_smoke import ACCURACY_TOLERANCE, LOSS_TOLERANCE

    def load(path: str) -> dict[str, dict[str, Any]]:
        return {record["case"]: record for record in map(json.loads, Path(path).read_text().splitlines()) if "round1" in record}

    first, second = load(args.first), load(args.second)
    names = Path(args.first).stem, Path(args.second).stem
    print(f"| Case | {names[0]}: round-1 acc., loss | {names[1]}: round-1 acc., loss | Within the suite's tolerance |")
    print("|---|---|---|---|")
    outside = 0
    for case in [case for case in all_cases() if case in first and case in second]:
        (acc_a, loss_a), (acc_b, loss_b) = first[case]["round1"], second[case]["round1"]
        within = abs(acc_a - acc_b) <= ACCURACY_TOLERANCE and abs(loss_a - loss_b) <= LOSS_TOLERANCE * abs(loss_b)
        outside += not within
        print(f"| {case} | {acc_a:.4f}, {loss_a:.4f} | {acc_b:.4f}, {loss_b:.4f} | {'yes' if within else '**no**'} |")
    missing = sorted(set(first) ^ set(second))
    if missing:
        print(f"\nIn one file only: {', '.join(missing)}")
    return 1 if outside else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_worker"]:  # a worker process started by `run`
        worker(**json.loads(argv[1]))
        os._exit(0)  # leave no Ray or CUDA teardown to hang a finished worker
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    runner = commands.add_parser("run", help="every case once on one device")
    runner.add_argument("--gpus", type=float, required=True, help="runtime.num_gpus_per_actor: 0.25 on a GPU, 0 for the CPU")
    runner.add_argument("--workers", type=int, default=4, help="cases at a time, each worker its own Ray instance")
    runner.add_argument("--cpus", type=int, default=4, help="CPUs of each worker's Ray instance")
    runner.add_argument("--budget", type=float, default=3600, help="seconds after which no case starts")
    runner.add_argument("--grace", type=float, default=60, help="seconds a case may run past the budget before its worker is killed")
    runner.add_argument("--cases", default=None, help="comma-separated METHOD:ENCODER (default: all)")
    runner.add_argument("--twice", default=DEFAULT_TWICE, help="cases run a second time to compare the two runs bit for bit")
    runner.add_argument("--out", required=True, help="the JSON-lines file")
    comparer = commands.add_parser("compare", help="round-1 means of two files, case by case")
    comparer.add_argument("first")
    comparer.add_argument("second")
    args = parser.parse_args(argv)
    return run(args) if args.command == "run" else compare(args)


if __name__ == "__main__":
    sys.exit(main())
