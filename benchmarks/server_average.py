"""The server's weighted average of a round's encoders, folded by one thread against
several (hdcfl_ray/maths/aggregate.py): the same function doing the same work, the
thread count the only difference, each measured in fresh processes (median).

    python -m benchmarks.server_average [--clients 10] [--values 11173962] [--repeats 5] [--out docs/benchmarks.md]

The default vector is a ResNet-18 encoder (11,173,962 float values, 45 MB); the bits are
the same with any thread count (tests/test_weighted_average_threads.py), and the
benchmark checks it once more on its own inputs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import time
from typing import Any

from benchmarks._common import append_markdown, machine_description, module_environment, print_table

RESNET18_ENCODER_VALUES = 11_173_962


def _child(clients: int, values: int, cores: int) -> dict[str, Any]:
    import numpy as np

    from hdcfl_ray.maths import aggregate

    usable = aggregate._usable_cores()
    aggregate._usable_cores = lambda: min(cores, usable)  # type: ignore[assignment]
    rng = np.random.default_rng(0)
    vectors = [rng.standard_normal(values, dtype=np.float32) for _ in range(clients)]
    weights = [float(w) for w in rng.integers(100, 500, size=clients)]
    aggregate.weighted_average(vectors[:2], weights[:2])  # the first touch of the accumulator's pages
    started = time.perf_counter()
    result = aggregate.weighted_average(vectors, weights)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "threads": len(aggregate._thread_slices(values)), "digest": hashlib.sha256(result.tobytes()).hexdigest()[:16]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--values", type=int, default=RESNET18_ENCODER_VALUES)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", help="append a dated section to this Markdown file")
    parser.add_argument("--child-cores", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_cores is not None:
        print(json.dumps(_child(args.clients, args.values, args.child_cores)))
        return 0
    measured: dict[str, list[dict[str, Any]]] = {"one thread": [], "threads": []}
    for _ in range(args.repeats):  # alternate, so a slow spell of the machine hits both
        for label, cores in (("one thread", 1), ("threads", 1 << 10)):
            command = [sys.executable, "-m", "benchmarks.server_average", "--clients", str(args.clients),
                       "--values", str(args.values), "--child-cores", str(cores)]
            output = subprocess.run(command, check=True, capture_output=True, text=True, env=module_environment()).stdout
            measured[label].append(json.loads(output.strip().splitlines()[-1]))
    digests = {record["digest"] for records in measured.values() for record in records}
    if len(digests) != 1:
        print(f"error: the threads changed the bits: {sorted(digests)}", file=sys.stderr)
        return 1
    one = statistics.median(record["seconds"] for record in measured["one thread"])
    rows = []
    for label, records in measured.items():
        median = statistics.median(record["seconds"] for record in records)
        rows.append({"fold": label, "threads": records[0]["threads"], "median s": round(median, 3),
                     "vs one thread": round(one / median, 2), "processes": len(records), "same bits": "yes"})
    print_table(rows)
    if args.out:
        command = f"python -m benchmarks.server_average --clients {args.clients} --values {args.values} --repeats {args.repeats}"
        append_markdown(args.out, f"The server's average of {args.clients} encoders of {args.values:,} values", command, machine_description(), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
