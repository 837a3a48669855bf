"""One synchronous round of K clients with a ResNet-18 encoder (11.2 M floats) at
full participation, on Ray: what a round needs in memory when every client uploads.

Every update stays in Ray's object store (capped at `--object-store-gb`, spilled
to disk beyond) until the server's fold reaches it; the server reads one upload
at a time in client-id order (`runtime/server/stored_models.py`,
`maths/aggregate.LazyColumn`). Held in a list, the round's uploads would be
K x 45 MB (45 GB at K = 1000). Each client holds `--samples` tiny synthetic
images, so the round measures the upload path rather than training. Reports the
wall time, the round's aggregation time, and the peak PSS summed over every
process of the run (driver, Ray daemons, server and host actors; the object
store's shared memory counted once).

    python -m benchmarks.streaming_round                       # K = 1000
    python -m benchmarks.streaming_round --clients 100 --method fedavg --out docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import yaml

from benchmarks._common import (
    append_markdown,
    machine_description,
    print_table,
    run_measured,
)
from hdcfl_ray.logs.table_writer import read_table

REPO = Path(__file__).resolve().parents[1]


def scenario(clients: int, samples: int, method: str, out_dir: Path) -> dict:
    algorithm: dict = {"name": method}
    if method == "hdcfl":
        algorithm["hdcfl"] = {"groups": 4, "activation_round": 1, "refresh_every": 1, "cache": "disk"}
    return {
        "name": f"streaming-k{clients}",
        "seed": 42,
        "dataset": {"name": "synthetic", "num_classes": 10, "image_size": 32, "channels": 3,
                    "train_samples": samples * clients, "test_samples": 2 * clients},
        "partition": {"kind": "rotation", "num_clients": clients, "angles": [0, 90, 180, 270], "test_per_client": 2},
        "model": {"encoder": "resnet18_cifar", "feature_dim": 512},
        "algorithm": algorithm,
        "protocol": {"rounds": 1, "participation": 1.0, "local_epochs": 1, "batch_size": samples},
        "runtime": {"backend": "ray", "clients_per_actor": (clients + 1) // 2, "num_cpus_per_actor": 1},
        "checkpoint": {"every": None},
        "output": {"dir": str(out_dir)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=2, help="training images per client")
    parser.add_argument("--method", default="fedavg", choices=["fedavg", "fedavg_se", "hdcfl"])
    parser.add_argument("--object-store-gb", type=float, default=4.0, help="Ray object store cap (spills beyond)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = Path(tmp) / "runs"
        path = Path(tmp) / "scenario.yaml"
        path.write_text(yaml.safe_dump(scenario(args.clients, args.samples, args.method, out_dir), sort_keys=False))
        env = dict(os.environ, RAY_DEFAULT_OBJECT_STORE_MAX_MEMORY_BYTES=str(int(args.object_store_gb * 1e9)))
        measured = run_measured([str(Path(sys.executable).with_name("hdcfl-ray")), "simulate", str(path), "--quiet"], env=env, cwd=REPO)
        if measured.returncode != 0:
            raise SystemExit(f"K = {args.clients} failed:\n{measured.stderr[-3000:]}")
        run_dir = next(out_dir.iterdir())
        rounds = read_table(run_dir, "rounds").to_pydict()
    row = {
        "method": args.method,
        "clients": args.clients,
        "encoder floats": "11.2 M",
        "uploads held in a list GB": round(args.clients * 11.2e6 * 4 / 1e9, 1),
        "object store cap GB": args.object_store_gb,
        "wall s": round(measured.wall_s, 1),
        "round s": round(rounds["wall_time_s"][0], 1),
        "aggregate s": round(rounds["aggregate_s"][0], 1),
        "peak memory GB": round(measured.peak_memory_bytes / 1e9, 2),
    }
    print_table([row])
    if args.out:
        append_markdown(
            args.out,
            f"Streaming aggregation: one full-participation round, {args.clients} ResNet-18 clients on Ray",
            f"python -m benchmarks.streaming_round --clients {args.clients} --method {args.method} --object-store-gb {args.object_store_gb}",
            machine_description(),
            [row],
        )


if __name__ == "__main__":
    main()
