"""A batched round's work outside the step loop: one round of N ResNet-18 clients
trained together on one host (FedAvg, `runtime.batched_training`), and the server's
average of their uploads, timed part by part.

    round_s          the host's round (`ClientHost.train_many`) plus the server's average
    step_loop_s      `batched_training.run_steps`: the SGD steps themselves
    loads_s          the clients' `ctx.load` calls and any move of their weights to the device
    snapshots_s      the clients' `ctx.snapshot` calls and any copy of the group's weights to the host
    finite_check_s   the checks that every upload is finite (on the host, and on the device)
    averaging_s      `weighted_average_model` over the uploads (the server's FedAvg)
    group_rest_s     the rest of the batched training call: the plan, the stacked weights'
                     build and their rows copied back into the clients' models
    other_s          the rest of the round (threads, the clients' tasks, the host's bookkeeping)
    outside_share    (round_s - step_loop_s) / round_s

Each part is timed exclusive of the parts timed inside it; on CUDA each is
synchronised at both ends. The first round warms up (the clients' tensors, the
replicas, kernel choice) and is not counted; the second is measured.

    python -m benchmarks.round_overhead [--repeats 5] [--clients 10] [--images-per-client 64] [--device cpu] [--per-client] [--out FILE.json]
    python -m benchmarks.round_overhead --dry-run       # a small CNN and 3 clients, seconds

`--per-client` switches the staging buffer off (runtime/client/replica_weights.py): every
load goes into the client's model and the stacked weights are built from the models, as
before staging, for a comparison on the same code.

`--repeats N` runs N fresh processes one after another and reports each part's median.
`measure()` runs one round in this process (benchmarks/gpu_check.py calls it on a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Callable, Iterator

from benchmarks._common import machine_description, module_environment, print_table

PARTS = ("step_loop_s", "loads_s", "snapshots_s", "finite_check_s", "averaging_s", "group_rest_s")
KEYS = ("round_s", *PARTS, "other_s", "outside_share")
BATCH_SIZE = 32


class _PartTimers:
    """Exclusive wall time per part: a part timed inside another is not counted twice.
    The host runs one client thread at a time, so one stack of open parts serves them all."""

    def __init__(self, synchronise: Callable[[], None]) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._open: list[float] = []  # per open part: the time of the parts inside it
        self._synchronise = synchronise

    def wrap(self, part: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._synchronise()
            started = time.perf_counter()
            self._open.append(0.0)
            try:
                return function(*args, **kwargs)
            finally:
                self._synchronise()
                elapsed = time.perf_counter() - started
                inside = self._open.pop()
                self.seconds[part] += elapsed - inside
                if self._open:
                    self._open[-1] += elapsed

        return timed


# (module, attribute, part): what is timed, where it exists (older code lacks some)
_TIMED = (
    ("hdcfl_ray.runtime.client.batched_training", "run_steps", "step_loop_s"),
    ("hdcfl_ray.runtime.client.batched_training", "train_together", "group_rest_s"),
    ("hdcfl_ray.runtime.client.replica_weights", "stacked_weights_to_device", "loads_s"),
    ("hdcfl_ray.runtime.client.replica_weights", "stacked_rows", "snapshots_s"),
    ("hdcfl_ray.runtime.client.replica_weights", "stacked_weights_to_host", "snapshots_s"),
    ("hdcfl_ray.runtime.client.replica_weights", "stacked_finite", "finite_check_s"),
    ("hdcfl_ray.runtime.client.client_context", "HostClientContext.load", "loads_s"),
    ("hdcfl_ray.runtime.client.client_context", "HostClientContext.snapshot", "snapshots_s"),
    ("hdcfl_ray.runtime.client.client_host", "_all_finite", "finite_check_s"),
)


@contextmanager
def _timed_parts(timers: _PartTimers) -> Iterator[None]:
    import importlib

    replaced: list[tuple[Any, str, Any]] = []
    for module_name, attribute, part in _TIMED:
        try:
            owner: Any = importlib.import_module(module_name)
        except ModuleNotFoundError:
            continue
        *path, name = attribute.split(".")
        for step in path:
            owner = getattr(owner, step)
        original = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
        if original is None:
            continue
        replaced.append((owner, name, original))
        setattr(owner, name, timers.wrap(part, original))
    try:
        yield
    finally:
        for owner, name, original in reversed(replaced):
            setattr(owner, name, original)


def _scenario(device: str, clients: int, images_per_client: int, dry_run: bool) -> Any:
    from hdcfl_ray.config.loading import build_scenario

    model = {"encoder": "small_cnn", "width": 8, "feature_dim": 16} if dry_run else {"encoder": "resnet18_cifar"}
    on_cuda = device.startswith("cuda")
    return build_scenario({
        "name": "round-overhead",
        "seed": 0,
        "dataset": {"name": "synthetic", "image_size": 32, "channels": 3, "num_classes": 10,
                    "train_samples": clients * images_per_client, "test_samples": clients * 8},
        "partition": {"kind": "iid", "num_clients": clients, "test_per_client": 8},
        "model": model,
        "algorithm": {"name": "fedavg"},
        "protocol": {"rounds": 2, "participation": 1.0, "local_epochs": 1, "batch_size": BATCH_SIZE},
        "runtime": {"backend": "local", "batched_training": True, "num_cpus_per_actor": 1,
                    "torch_threads": os.cpu_count() or 1, "num_gpus_per_actor": 1.0 if on_cuda else 0.0},
        "checkpoint": {"every": None},
    })  # fmt: skip


def measure(device: str = "cpu", clients: int = 10, images_per_client: int = 64, dry_run: bool = False, per_client: bool = False) -> dict[str, Any]:
    """One measured round (after one to warm up) of `clients` clients of `images_per_client`
    images trained batched on one host on `device`, and the server's average; seconds per
    part (module docstring). `dry_run`: a small CNN and at most 3 clients of 16 images;
    `per_client`: without the staging buffer."""
    with _without_staging() if per_client else nullcontext():
        return _measure(device, clients, images_per_client, dry_run)


@contextmanager
def _without_staging() -> Iterator[None]:
    from hdcfl_ray.runtime.client.replica_weights import StagingRows

    original = StagingRows.__dict__["for_model"]
    StagingRows.for_model = classmethod(lambda cls, *args: None)  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        StagingRows.for_model = original  # type: ignore[method-assign]


def _measure(device: str, clients: int, images_per_client: int, dry_run: bool) -> dict[str, Any]:
    import torch

    from hdcfl_ray.contract import ClientTask, ModelParams
    from hdcfl_ray.maths.aggregate import weighted_average_model
    from hdcfl_ray.runtime.backends.local_host import local_host
    from hdcfl_ray.runtime.initial_model import initial_parameters
    from hdcfl_ray.runtime.preflight import prepare_run
    from hdcfl_ray.runtime.server.messages import ClientJob

    if dry_run:
        clients, images_per_client = min(clients, 3), min(images_per_client, 16)
    prepared = prepare_run(_scenario(device, clients, images_per_client, dry_run))
    host = local_host(prepared)
    initial = initial_parameters(prepared.scenario, prepared.dataset)
    jobs = [ClientJob(client_id, ClientTask(models=("global",))) for client_id in host.client_ids()]
    on_cuda = host.device.type == "cuda"

    def synchronise() -> None:
        if on_cuda:
            torch.cuda.synchronize(host.device)

    def one_round(round_index: int) -> tuple[list[Any], ModelParams]:
        flat = host.train_many(round_index, jobs, {"global": initial})
        uploads, metas = flat[0::3], flat[1::3]
        if not all(meta.accepted for meta in metas):
            raise RuntimeError("an upload was rejected: the benchmark's round must train cleanly")
        averaging = timers.wrap("averaging_s", weighted_average_model) if round_index > 1 else weighted_average_model
        return metas, averaging(uploads, lambda models: models["model"], [meta.num_samples for meta in metas])

    timers = _PartTimers(synchronise)
    one_round(1)
    timers.seconds.clear()
    with _timed_parts(timers):
        synchronise()
        started = time.perf_counter()
        metas, _ = one_round(2)
        synchronise()
        round_s = time.perf_counter() - started
    parts = {part: timers.seconds.get(part, 0.0) for part in PARTS}
    return {
        "device": str(host.device),
        "encoder": prepared.scenario.model.encoder,
        "clients": len(jobs),
        "images_per_client": images_per_client,
        "batch_size": BATCH_SIZE,
        "trained_together": max(int(meta.trained_together or 1) for meta in metas),
        "round_s": round_s,
        **parts,
        "other_s": round_s - sum(parts.values()),
        "outside_share": (round_s - parts["step_loop_s"]) / round_s,
    }


def _one_process(arguments: list[str]) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.round_overhead", "--one", *arguments]
    done = subprocess.run(command, env=module_environment(), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes, one after another (medians reported)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--images-per-client", type=int, default=64)
    parser.add_argument("--dry-run", action="store_true", help="a small CNN and 3 clients of 16 images (checks the script)")
    parser.add_argument("--per-client", action="store_true", help="without the staging buffer: loads into each model, the stacked build from the models")
    parser.add_argument("--out", type=Path, default=None, help="write the runs and medians to this JSON file")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: one round, JSON on stdout
    args = parser.parse_args()
    options = ["--device", args.device, "--clients", str(args.clients), "--images-per-client", str(args.images_per_client)]
    options += ["--dry-run"] if args.dry_run else []
    options += ["--per-client"] if args.per_client else []
    if args.one:
        print(json.dumps(measure(args.device, args.clients, args.images_per_client, args.dry_run, args.per_client)))
        return 0
    runs = [_one_process(options) for _ in range(args.repeats)]
    medians = {key: statistics.median(run[key] for run in runs) for key in KEYS}
    print_table([{"run": str(index + 1), **{key: run[key] for key in KEYS}} for index, run in enumerate(runs)]
                + [{"run": "median", **medians}])  # fmt: skip
    if args.out is not None:
        command = "python -m benchmarks.round_overhead " + " ".join(sys.argv[1:])
        result = {"command": command, "machine": machine_description(), "settings": {k: runs[0][k] for k in
                  ("device", "encoder", "clients", "images_per_client", "batch_size", "trained_together")},
                  "median": medians, "runs": runs}  # fmt: skip
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
