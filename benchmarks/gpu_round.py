"""The paper round's training throughput on one GPU, per mode and per backend, against
three ceilings measured in the same run on the same GPU.

The round is that of scenarios/paper/c10-rot-no-pretrain.yaml: ResNet-18 (CIFAR stem),
20 clients in four rotation groups, 10 participants a round, batch 32, SGD with
momentum, HDC-FL. Its images are synthetic (32x32x3, 10 classes: the rate does not
depend on the pixels, and the 53 MB CIFAR-10 copy does not fit a GPU machine's
copy of the working tree beside the Ray wheels); `--images-per-client` (default
2,500, the paper's 50,000 / 20) sets the round's size. Each run trains three
rounds: round 1 warms up (kernel choice, allocation), round 2 trains only, round
3 trains and evaluates every client (10,000 test images, at the refresh that
HDC-FL makes there), so

  images/s               round 2's trained images / its wall time
  evaluated-round cost   round 3's wall time / round 2's (target <= 1.10)

Measured, each as far as the time budget allows (what is left out says so):

  layout                 the default plan (backend auto, one host per GPU as the paper scenarios
                         ask: the hosts and how many participants trained as one batch) and the
                         modes below on one local host holding every client; for the default plan,
                         the local host and each Ray layout, per round and host the clients that
                         trained together (benchmarks/round_layout.py), under "layouts"
  step profile           one batched step of the round's participants: the host's top-level
                         operations, its waits for the GPU, blocking CUDA calls, GPU busy fraction
  outside the step loop  one batched round of the participants on one host and the server's
                         average, timed part by part (benchmarks/round_overhead.py): the share
                         of the round outside the step loop ("outside_step_loop")
  modes, local backend   one-at-a-time (exact fp32, deterministic: the former default),
                         batched (runtime.batched_training: the CUDA default), batched with
                         TF32, with bf16 autocast, and the fastest setting (non-deterministic
                         kernels, TF32, bf16, channels_last: not reproducible, an upper bound)
  bit identity           the default mode run twice: are the clients tables bit-identical
  Ray backend            the default mode with 1, 2 and 4 hosts sharing the GPU
                         (runtime.num_gpus_per_actor = 1/N; 4 hosts at 0.25 is the shared layout,
                         each host batching only its own participants, measured beside the default)
  ceilings               a plain PyTorch loop on the same model and batch size, data on the
                         GPU (one loop); N such loops in N processes at once (N = the round's
                         participants, capped at --concurrent); one loop on the fused batch of
                         the round's participants (batch 32 x 10): each in each mode's
                         arithmetic (fp32, TF32, bf16, fastest)

and printed as ratios: a mode's images/s over each ceiling in its own arithmetic, and
Ray's over the local backend's.

    python -m benchmarks.gpu_round [--budget 300] [--out FILE.json]     # on a GPU machine
    python -m benchmarks.gpu_round --dry-run                            # anywhere: every path on the CPU, tiny

`--dry-run` runs every measurement with tiny sizes on the CPU (a small CNN, 4 clients
of 16 images, two loops) so that the suite can check the script without a GPU
(tests/test_gpu_check.py runs it as gpu_check's paper_round step); its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._common import machine_description, print_table  # standard library only
from benchmarks.round_layout import layout_lines, run_layout  # standard library at import

REPO = Path(__file__).resolve().parents[1]

PAPER = REPO / "scenarios/paper/c10-rot-no-pretrain.yaml"
ROUNDS = 3  # warm-up, training only, training + evaluation


@dataclass(frozen=True)
class Arithmetic:
    """The CUDA settings a mode computes with; ceilings are measured in each."""

    name: str
    precision: str = "fp32"
    tf32: bool = False
    deterministic: bool = True
    channels_last: bool = False

    def runtime(self) -> dict[str, Any]:
        return {"precision": self.precision, "cuda_tf32": self.tf32, "cuda_deterministic": self.deterministic,
                "channels_last": self.channels_last}


FP32 = Arithmetic("fp32")
TF32 = Arithmetic("tf32", tf32=True)
BF16 = Arithmetic("bf16", precision="bf16")
FASTEST = Arithmetic("fastest", precision="bf16", tf32=True, deterministic=False, channels_last=True)
# mode -> (its runtime keys beside the arithmetic, its arithmetic)
MODES: dict[str, tuple[dict[str, Any], Arithmetic]] = {
    "one-at-a-time": ({"batched_training": False}, FP32),
    "batched": ({"batched_training": True}, FP32),
    "batched+tf32": ({"batched_training": True}, TF32),
    "batched+bf16": ({"batched_training": True}, BF16),
    "fastest": ({"batched_training": True}, FASTEST),
}
DEFAULT_MODE = "batched"  # what a CUDA host runs with the scenario's defaults


@dataclass(frozen=True)
class Sizes:
    clients: int
    participants: int
    images_per_client: int
    test_per_client: int
    model: dict[str, Any]
    batch_size: int = 32


def paper_sizes(images_per_client: int) -> Sizes:
    return Sizes(clients=20, participants=10, images_per_client=images_per_client, test_per_client=500,
                 model={"encoder": "resnet18_cifar"})


DRY_SIZES = Sizes(clients=4, participants=2, images_per_client=16, test_per_client=8,
                  model={"encoder": "small_cnn", "width": 8, "feature_dim": 16}, batch_size=8)


def overrides(sizes: Sizes, runtime: dict[str, Any], out: Path, gpu: bool) -> dict[str, Any]:
    """The paper scenario's keys for one measured run on synthetic data."""
    return {
        "name": "gpu-round",
        "dataset": {"name": "synthetic", "path": None, "image_size": 32, "channels": 3, "num_classes": 10,
                    "train_samples": sizes.clients * sizes.images_per_client, "test_samples": sizes.clients * sizes.test_per_client},
        "partition.num_clients": sizes.clients,
        "partition.test_per_client": sizes.test_per_client,
        "model": sizes.model,
        "algorithm.hdcfl.activation_round": ROUNDS,  # HDC-FL's one refresh (and evaluation) at the last round
        "protocol.rounds": ROUNDS,
        "protocol.participation": sizes.participants,
        "protocol.batch_size": sizes.batch_size,
        "protocol.eval_every": 1000,
        "checkpoint.every": None,
        "output.save_refresh_cache": False,
        "output.dir": str(out),
        "runtime": {"num_cpus_per_actor": 1, **runtime, "num_gpus_per_actor": runtime.get("num_gpus_per_actor", 1.0) if gpu else 0.0},
    }


def ray_hosts_sharing_the_gpu(hosts: int, clients: int) -> dict[str, Any]:
    """The runtime keys of `hosts` Ray hosts on one GPU, 1/hosts of it each, holding the
    clients in contiguous blocks (4: the shared layout, each host batching only its own)."""
    return {"backend": "ray", "max_actors": hosts, "clients_per_actor": -(-clients // hosts), "num_gpus_per_actor": round(1.0 / hosts, 6)}


def round_overhead(sizes: Sizes, gpu: bool, dry_run: bool) -> dict[str, Any]:
    """benchmarks/round_overhead.py on the round's participants (the paper's images per
    client; a dry run: a small CNN, at most 3 clients of 16 images, on the CPU): one batched round
    on one host and the server's average, seconds per part; `outside_share` is the share of
    the round spent outside the step loop (loads, snapshots, finite checks, averaging)."""
    from benchmarks.round_overhead import measure as measure_round_overhead

    return measure_round_overhead("cuda" if gpu else "cpu", sizes.participants, sizes.images_per_client, dry_run=dry_run)


def measured_run(sizes: Sizes, runtime: dict[str, Any], work: Path, gpu: bool) -> tuple[dict[str, Any], Path]:
    import hdcfl_ray

    started = time.perf_counter()
    run = hdcfl_ray.simulate(PAPER, overrides=overrides(sizes, runtime, work, gpu), progress=False)
    table = run.rounds.sort_by("round").to_pydict()
    seconds, images = table["wall_time_s"], table["samples_trained"]
    round_two = [row for row in run.table("updates").to_pylist() if row["round"] == 2]
    result = {
        "round_wall_s": [round(s, 3) for s in seconds],
        "images_per_round": images,
        "images_per_s": round(images[1] / seconds[1], 1),
        "evaluated_round_cost": round(seconds[2] / seconds[1], 3),
        "run_wall_s": round(time.perf_counter() - started, 1),
        # the layout: hosts, and how many of round 2's participants trained as one batched group
        "backend": run.manifest["runtime"]["backend"],
        "hosts": run.manifest["host_layout"]["hosts"],
        "trained_together": sorted({int(row["trained_together"] or 1) for row in round_two}),
    }
    return result, run.dir


def outside_step_loop_line(overhead: dict[str, Any]) -> str:
    """benchmarks/round_overhead.py's result in one line."""
    parts = ", ".join(f"{key[:-2]} {overhead[key] * 1000:.1f} ms" for key in ("loads_s", "snapshots_s", "finite_check_s", "averaging_s",
                                                                       "group_rest_s", "other_s") if key in overhead)
    return (f"outside the step loop: {overhead['outside_share']:.1%} of a batched round of {overhead['clients']} clients "
            f"({overhead['encoder']}, {overhead['device']}, round {overhead['round_s'] * 1000:.1f} ms, step loop "
            f"{overhead['step_loop_s'] * 1000:.1f} ms; {parts})")


# ---- ceilings: plain PyTorch loops ------------------------------------------------------


def plain_loop_rate(arithmetic: Arithmetic, batch: int, seconds: float, dry_run: bool, start_at: float | None = None) -> float:
    """Images/s of a plain loop (torch.optim.SGD, data resident on the device) training the
    paper's model at `batch` in `arithmetic`, over about `seconds` after warm-up."""
    import torch

    from benchmarks._workload import cifar_model
    from hdcfl_ray.config.schema import RuntimeConfig
    from hdcfl_ray.runtime.client.device import choose_device, configure_cuda

    sizes = DRY_SIZES if dry_run else paper_sizes(2500)
    runtime = RuntimeConfig(num_gpus_per_actor=0.0 if dry_run else 1.0, cuda_tf32=arithmetic.tf32,
                            cuda_deterministic=arithmetic.deterministic)
    device = choose_device(runtime)
    configure_cuda(runtime, device)
    model = cifar_model(sizes.model, device)
    memory_format = torch.channels_last if arithmetic.channels_last else torch.contiguous_format
    model.encoder.to(memory_format=memory_format)
    pool = 64 * batch if not dry_run else 4 * batch
    inputs = torch.rand(pool, 3, 32, 32, device=device).contiguous(memory_format=memory_format)
    labels = torch.randint(0, 10, (pool,), device=device)
    optimizer = torch.optim.SGD([*model.encoder.parameters(), *model.head.parameters()], lr=0.01, momentum=0.9, weight_decay=5e-4)
    half = torch.bfloat16 if arithmetic.precision == "bf16" else None
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    model.encoder.train()

    def step(position: int) -> None:
        start = (position * batch) % pool
        x, y = inputs[start : start + batch], labels[start : start + batch]
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=half or torch.float32, enabled=half is not None):
            loss = torch.nn.functional.cross_entropy(model.head(model.encoder(x)), y)
        loss.backward()
        optimizer.step()

    for position in range(3 if dry_run else 20):
        step(position)
    sync()
    if start_at is not None:  # concurrent loops start together
        time.sleep(max(0.0, start_at - time.time()))
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for _ in range(10):
            step(done)
            done += 1
        sync()
    return done * batch / (time.perf_counter() - started)


def concurrent_loops_rate(arithmetic: Arithmetic, loops: int, batch: int, seconds: float, dry_run: bool) -> float:
    """The summed images/s of `loops` plain loops in as many processes, started together."""
    # after every process has built its model (a dry run only checks the path: a child not ready by then starts late)
    start_at = time.time() + (15.0 if not dry_run else 4.0)
    command = [sys.executable, "-m", "benchmarks.gpu_round", "--loop-child", arithmetic.name, "--batch", str(batch),
               "--seconds", str(seconds), "--start-at", str(start_at), *(["--dry-run"] if dry_run else [])]
    children = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=REPO) for _ in range(loops)]
    rates = []
    for child in children:
        output, _ = child.communicate(timeout=seconds + 120)
        if child.returncode != 0:
            raise RuntimeError(f"a plain-loop process exited {child.returncode}")
        rates.append(float(output.strip().splitlines()[-1]))
    return sum(rates)


ARITHMETICS = {arithmetic.name: arithmetic for arithmetic in (FP32, TF32, BF16, FASTEST)}


# ---- the measurement ----------------------------------------------------------------------


class Budget:
    def __init__(self, seconds: float) -> None:
        self.deadline = time.time() + seconds

    def left(self) -> float:
        return self.deadline - time.time()


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks.gpu_check import compare_clients_tables
    from hdcfl_ray.logs.table_writer import read_table

    dry_run = args.dry_run
    gpu = not dry_run
    sizes = DRY_SIZES if dry_run else paper_sizes(args.images_per_client)
    budget = Budget(args.budget)
    # a run of the round in one mode needs about this long (start-up and three rounds)
    run_cost = 5.0 if dry_run else 60.0
    loop_seconds = 1.0 if dry_run else 6.0
    report: dict[str, Any] = {
        "benchmark": "gpu_round", "mode": "dry_run" if dry_run else "gpu", "command": " ".join(["python -m benchmarks.gpu_round", *sys.argv[1:]]),
        "machine": machine_description(), "sizes": sizes.__dict__, "rounds": ROUNDS, "modes": {}, "ray": {},
        "ceilings": {}, "layouts": {}, "outside_step_loop": None, "skipped": [],
    }
    if gpu:
        import torch

        report["machine"]["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        report["machine"]["cuda"] = torch.version.cuda
    out = Path(args.out) if args.out else None

    def save() -> None:
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(report, indent=2, default=str) + "\n")

    def record_layout(name: str, run_dir: Path) -> None:
        report["layouts"][name] = run_layout(run_dir)

    work = Path(tempfile.mkdtemp(prefix="gpu-round-"))
    wanted = [arithmetic.name for _, (_, arithmetic) in MODES.items()]
    for name in dict.fromkeys(wanted):  # the ceilings first: cheap, and every ratio needs them
        arithmetic = ARITHMETICS[name]
        if budget.left() < 3 * loop_seconds + 10:
            report["skipped"].append(f"ceilings in {name}: out of time")
            continue
        single = plain_loop_rate(arithmetic, sizes.batch_size, loop_seconds, dry_run)
        fused = plain_loop_rate(arithmetic, sizes.batch_size * sizes.participants, loop_seconds, dry_run)
        report["ceilings"][name] = {"one_loop": round(single, 1), f"fused_batch_{sizes.batch_size * sizes.participants}": round(fused, 1)}
        save()
    loops = min(sizes.participants, args.concurrent)
    for name in ("fp32", "fastest"):
        if name in report["ceilings"] and budget.left() > loop_seconds + 60:
            rate = concurrent_loops_rate(ARITHMETICS[name], loops, sizes.batch_size, loop_seconds, dry_run)
            report["ceilings"][name][f"{loops}_concurrent_loops"] = round(rate, 1)
            save()
        else:
            report["skipped"].append(f"{loops} concurrent loops in {name}: out of time")
    # the host's side of one batched step of the round's participants: operations, waits, GPU busy
    if budget.left() > run_cost:
        from benchmarks.batched_step_ops import device_profile

        report["step_profile"] = device_profile(
            "cuda" if gpu else "cpu", sizes.participants, sizes.model["encoder"], 3 * sizes.batch_size, sizes.batch_size
        )
        save()
    else:
        report["skipped"].append("the batched step's profile: out of time")
    # the plan a user gets with the scenario's defaults and one GPU share per host (backend auto)
    if budget.left() > run_cost:
        keys, arithmetic = MODES[DEFAULT_MODE]
        report["default_plan"], plan_dir = measured_run(sizes, {**keys, **arithmetic.runtime(), "backend": "auto"}, work / "default-plan", gpu)
        record_layout("default plan", plan_dir)
        save()
    else:
        report["skipped"].append("the default plan: out of time")
    # the share of a batched round spent outside the step loop (a failure there leaves the rest measured)
    if budget.left() > run_cost:
        try:
            report["round_overhead"] = round_overhead(sizes, gpu, dry_run)
            report["outside_step_loop"] = round(report["round_overhead"]["outside_share"], 4)
        except Exception as error:
            report["skipped"].append(f"the round's work outside the step loop: {type(error).__name__}: {error}")
        save()
    else:
        report["skipped"].append("the round's work outside the step loop: out of time")
    base = {"backend": "local", "max_actors": 1}  # one host holding every client: the round's participants in one batch
    for mode, (keys, arithmetic) in MODES.items():
        if budget.left() < run_cost:
            report["skipped"].append(f"mode {mode}: out of time")
            continue
        result, run_dir = measured_run(sizes, {**base, **keys, **arithmetic.runtime()}, work / mode, gpu)
        result["arithmetic"] = arithmetic.name
        ceilings = report["ceilings"].get(arithmetic.name, {})
        result["over_ceilings"] = {name: round(result["images_per_s"] / value, 3) for name, value in ceilings.items()}
        report["modes"][mode] = result
        if mode == DEFAULT_MODE:
            report["default_run_dir"] = str(run_dir)
            record_layout(f"local, one host, {mode}", run_dir)
        save()
    if DEFAULT_MODE in report["modes"] and budget.left() > run_cost:
        keys, arithmetic = MODES[DEFAULT_MODE]
        _, again = measured_run(sizes, {**base, **keys, **arithmetic.runtime()}, work / "default-again", gpu)
        report["bit_identity"] = compare_clients_tables(
            read_table(Path(report["default_run_dir"]), "clients"), read_table(again, "clients")
        )
        save()
    else:
        report["skipped"].append("bit identity of the default mode: out of time")
    keys, arithmetic = MODES[DEFAULT_MODE]
    local_rate = report["modes"].get(DEFAULT_MODE, {}).get("images_per_s")
    for hosts in (1, 2) if dry_run else (1, 2, 4):
        if budget.left() < run_cost * 1.5:
            report["skipped"].append(f"Ray with {hosts} hosts: out of time")
            continue
        runtime = {**keys, **arithmetic.runtime(), **ray_hosts_sharing_the_gpu(hosts, sizes.clients)}
        result, ray_dir = measured_run(sizes, runtime, work / f"ray-{hosts}", gpu)
        record_layout(f"ray, {hosts} host(s)" + (f" at {runtime['num_gpus_per_actor']} GPU each" if gpu else " on the CPU"), ray_dir)
        if local_rate:
            result["over_local_backend"] = round(result["images_per_s"] / local_rate, 3)
        report["ray"][f"{hosts}_hosts"] = result
        save()
    save()
    return report


def print_summary(report: dict[str, Any]) -> None:
    rows = []
    for mode, result in report["modes"].items():
        row = {"run": f"local, {mode}", "images/s": result["images_per_s"], "evaluated round": result["evaluated_round_cost"]}
        row.update({f"/ {name}": ratio for name, ratio in result["over_ceilings"].items()})
        rows.append(row)
    for hosts, result in report["ray"].items():
        rows.append({"run": f"ray, {hosts.replace('_', ' ')}, {DEFAULT_MODE}", "images/s": result["images_per_s"],
                     "evaluated round": result["evaluated_round_cost"], "/ local": result.get("over_local_backend")})
    if "default_plan" in report:
        plan = report["default_plan"]
        rows.append({"run": f"default plan ({plan['backend']}, {plan['hosts']} host(s), groups of {plan['trained_together']})",
                     "images/s": plan["images_per_s"], "evaluated round": plan["evaluated_round_cost"]})
    if rows:
        print_table(rows)
    for name, ceilings in report["ceilings"].items():
        print(f"ceilings in {name}: " + ", ".join(f"{key} {value:,.0f} images/s" for key, value in ceilings.items()))
    if "step_profile" in report:
        profile = report["step_profile"]
        print(f"one batched step of {profile['clients']} clients on {profile['device']}: {profile['top_level_ops_per_step']} host operations, "
              f"{profile['host_waits_per_step']} host waits, {profile['blocking_cuda_calls_per_step']} blocking CUDA calls, "
              f"GPU busy {profile['gpu_busy_fraction']}")
    if "bit_identity" in report:
        print(f"default mode run twice: bit-identical = {report['bit_identity']['bit_identical']}")
    for name, layout in report.get("layouts", {}).items():
        print("\n".join(layout_lines(name, layout)))
    if report.get("round_overhead"):
        print(outside_step_loop_line(report["round_overhead"]))
    for skipped in report["skipped"]:
        print(f"not measured: {skipped}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="every measurement on the CPU with tiny sizes")
    parser.add_argument("--budget", type=float, default=300.0, help="seconds for the whole benchmark (what does not fit is skipped)")
    parser.add_argument("--images-per-client", type=int, default=2500, help="training images per client (paper: 2,500)")
    parser.add_argument("--concurrent", type=int, default=10, help="at most this many concurrent plain loops")
    parser.add_argument("--out", default=None, help="write the JSON here")
    parser.add_argument("--loop-child", choices=sorted(ARITHMETICS), help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=32, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=6.0, help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.loop_child:  # one of the concurrent plain loops: print its images/s
        print(plain_loop_rate(ARITHMETICS[args.loop_child], args.batch, args.seconds, args.dry_run, args.start_at))
        return 0
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            print("error: no CUDA GPU here; use --dry-run to check the script on a CPU", file=sys.stderr)
            return 2
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    report = measure(args)
    print_summary(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
