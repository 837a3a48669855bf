"""One GPU check of hdcfl-ray, made to finish within 9 minutes on one GPU machine. Each step
runs in its own process with its own time budget and is a key of the JSON, rewritten after
every step (a kill loses nothing); a step that fails or runs out of time is recorded with
its error and the next one runs:

  machine               GPU, CUDA, torch and Ray versions, CPU model, git commit, date
  cuda_tests            python -m pytest -m cuda (4 xdist workers where pytest-xdist is installed):
                        passed / failed / skipped counts; no case starts in the step's last 75 s
                        (those count as skipped, named not_started_for_time, never as failed)
  throughput            samples/s of the project's train_locally against a plain PyTorch loop,
                        same model and synthetic 3x32x32 data, small_cnn and resnet18_cifar, fp32 and bf16
  paper_round           benchmarks/gpu_round.py: the paper round's images/s in the default plan (one host
                        per GPU, as the paper scenarios ask) and in each mode (one client at a time,
                        batched, TF32, bf16, fastest) on one local host holding every client, and with 1,
                        2 and 4 Ray hosts sharing the GPU (4 at 0.25: the shared layout), against a plain
                        loop, concurrent loops and the fused batch of the round's participants; one batched
                        step's host operations, host waits, blocking CUDA calls and GPU busy fraction
                        (profiler); the evaluated round's cost; the default mode twice
  bit_identity          two same-seed quickstart runs on the GPU (Ray, one host on the GPU): are their
                        clients tables bit-identical
  paper_rot_two_rounds  two rounds of scenarios/paper/c10-rot-no-pretrain.yaml on the CIFAR-10 Parquet copy
                        in the scenario's layout (one host per GPU: a round's 10 participants train as one
                        batched model), then, as time allows, in the shared layout (four hosts at 0.25 GPU,
                        each batching only its own participants): both runs' round times side by side

Every run a step makes for its layout (paper_round's default plan, local host and Ray hosts;
paper_rot_two_rounds' two layouts) is recorded under the step's "layouts" and printed: the host
count, per round and host the clients that trained together ("round 1 (...): host 0
[0,3,5,...] batched 10") and how many updates trained in groups of each size. paper_round
also records and prints `outside_step_loop`: the share of one batched round of the paper's
participants spent outside the step loop (loads, snapshots, finite checks, averaging;
benchmarks/round_overhead.py, its parts under `round_overhead`; null where not measured).

    bash benchmarks/gpu_check.sh                    # on the GPU machine (installs what is missing)
    python -m benchmarks.gpu_check --dry-run        # anywhere: everything but CUDA, in about a minute

--dry-run runs each step's code on the CPU with tiny sizes, checks that every command exists
and every scenario loads and validates with the same overrides (GPU share 0 where a check
needs the machine), and reports the CIFAR-10 Parquet folder (--cifar PATH,
$HDCFL_CIFAR10_PARQUET, shared/data/cifar10-jpeg or ../shared/data/cifar10-jpeg) found or
missing (a warning there). Exit 0 when every step passed, 1 otherwise, 2 on bad use.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from benchmarks._common import machine_description  # standard library only
from benchmarks.round_layout import layout_lines, run_layout  # standard library at import

REPO = Path(__file__).resolve().parents[1]

# seconds per step on the GPU machine and in a dry run; on the GPU the steps of one command together
# get at most TOTAL_BUDGET_S (9 minutes), a later step only what is left of it
# (paper_rot_two_rounds: two runs, the scenario's layout and the shared one, about 60 s each on an H200)
BUDGETS: dict[str, int] = {"machine": 20, "cuda_tests": 150, "throughput": 60, "paper_round": 240, "bit_identity": 50, "paper_rot_two_rounds": 250}
DRY_BUDGETS: dict[str, int] = {"machine": 30, "cuda_tests": 60, "throughput": 200, "paper_round": 150, "bit_identity": 60, "paper_rot_two_rounds": 60}
TOTAL_BUDGET_S = 540
# the cuda suite: pytest-xdist workers when it is installed (the H200 image has it), and the
# longest one case took there (ResNet-18: two GPU runs and the CPU reference), left free at the end
CUDA_TEST_WORKERS = 4
CUDA_TEST_LONGEST_S = 75
GRACE_S = 10  # a step process past its budget by this much is killed with its children
QUICKSTART = "scenarios/quickstart.yaml"
PAPER = "scenarios/paper/c10-rot-no-pretrain.yaml"
# one host on the GPU holding every client, as the paper scenarios lay a run out
QUICK_OVERRIDES = ["runtime.backend=ray", "runtime.num_gpus_per_actor=1", "protocol.rounds=3", "checkpoint.every=null"]
# the paper run's layouts: the scenario's own (one host per GPU, the round batched whole), then the
# shared one it is measured against (four hosts per GPU, each batching only its own participants)
PAPER_LAYOUTS: dict[str, list[str]] = {"one_host_per_gpu": [], "four_hosts_per_gpu": ["runtime.num_gpus_per_actor=0.25"]}
# small_cnn as in benchmarks/efficiency.py
ENCODERS: dict[str, dict[str, Any]] = {"small_cnn": {"encoder": "small_cnn", "width": 16, "feature_dim": 64},
                                       "resnet18_cifar": {"encoder": "resnet18_cifar"}}
CPU_SHARE = "runtime.num_gpus_per_actor=0"  # appended where a check must pass on a machine without a GPU


def paper_overrides(cifar: str) -> list[str]:
    """The paper run's --set values: two rounds on the Parquet copy, no refresh cache, no checkpoints."""
    return ["protocol.rounds=2", "dataset.name=parquet_images", f"dataset.path={cifar}",
            "output.save_refresh_cache=false", "checkpoint.every=null"]


def find_cifar(explicit: str | None) -> tuple[Path | None, list[str]]:
    """The CIFAR-10 Parquet folder and every place looked in, in order."""
    places = [explicit, os.environ.get("HDCFL_CIFAR10_PARQUET"), str(REPO / "shared/data/cifar10-jpeg"),
              str(REPO.parent / "shared/data/cifar10-jpeg")]
    looked = [place for place in places if place]
    for place in looked:
        if (Path(place) / "train.parquet").is_file() and (Path(place) / "test.parquet").is_file():
            return Path(place).resolve(), looked
    return None, looked


def cli_command() -> list[str]:
    """`hdcfl-ray` beside this Python when installed, else the same app run from cli.py."""
    script = Path(sys.executable).parent / "hdcfl-ray"
    return [str(script)] if script.is_file() else [sys.executable, str(REPO / "cli.py")]


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Replace `path` atomically: a reader (or a kill) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(partial, path)


def run_command(cmd: list[str], timeout_s: float) -> dict[str, Any]:
    """Run `cmd` in the repository in its own session; past `timeout_s` SIGTERM (a run stops
    resumably), SIGKILL 5 s later. Whatever it left (Ray daemons) is killed at the end."""
    started, timed_out = time.perf_counter(), False
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

        def signal_group(sig: signal.Signals) -> None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, sig)

        try:
            process.wait(timeout=max(timeout_s, 1.0))
        except subprocess.TimeoutExpired:
            timed_out = True
            signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
        signal_group(signal.SIGKILL)
        process.wait()
        log.seek(0)
        output = log.read()
    return {"cmd": " ".join(cmd), "returncode": process.returncode, "timed_out": timed_out,
            "seconds": round(time.perf_counter() - started, 2), "output_tail": output[-3000:]}


class Step:
    """One step's record, written to its file after every change (the orchestrator reads it back)."""

    def __init__(self, name: str, file: Path, deadline: float, dry_run: bool, cifar: str | None) -> None:
        self.file, self.deadline, self.dry_run, self.cifar = file, deadline, dry_run, cifar
        self.data: dict[str, Any] = {"status": "running", "warnings": []}
        self.work = Path(tempfile.mkdtemp(prefix=f"gpu-check-{name}-"))  # run folders; removed at the end

    def record(self, **values: Any) -> None:
        self.data.update(values)
        write_json(self.file, self.data)

    def warn(self, text: str) -> None:
        self.data["warnings"].append(text)
        self.record()

    def left(self, margin: float = 3.0) -> float:
        """Seconds this step may still spend on a command."""
        return self.deadline - time.time() - margin


def step_machine(step: Step) -> None:
    import torch

    facts = machine_description()
    facts.update(torch_cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(), cuda_available=torch.cuda.is_available())
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts.update(gpu=torch.cuda.get_device_name(0), gpu_count=torch.cuda.device_count(), gpu_memory_gb=round(props.total_memory / 1e9, 1),
                     compute_capability=f"{props.major}.{props.minor}", bf16_native=torch.cuda.is_bf16_supported(including_emulation=False))
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
        facts["nvidia_smi"] = run_command(query, 15)["output_tail"].strip()
    head = run_command(["git", "rev-parse", "HEAD"], 10) if shutil.which("git") else {"returncode": 1}
    dirty = run_command(["git", "status", "--porcelain", "--untracked-files=no"], 10)["output_tail"].strip() if head["returncode"] == 0 else None
    # a copy of the tree without .git (a device machine's): the caller may name the commit in $HDCFL_GIT_COMMIT
    facts["git"] = ({"commit": head["output_tail"].strip(), "dirty": bool(dirty)} if head["returncode"] == 0
                    else {"commit": os.environ.get("HDCFL_GIT_COMMIT"), "dirty": None})
    step.record(**facts)
    if not step.dry_run and not facts["cuda_available"]:
        raise RuntimeError("torch sees no CUDA GPU here; run with --dry-run on a machine without one")


def parse_pytest(output: str) -> dict[str, int]:
    """Counts from pytest's summary line, or from its progress characters when it was killed."""
    counts: dict[str, int] = {}
    lines = output.strip().splitlines()
    collected = re.search(r"(\d+)(?:/\d+)? tests? collected", output)
    if collected:
        counts["collected"] = int(collected.group(1))
    summary = next((line for line in reversed(lines) if re.search(r"\d+ (passed|failed|skipped|error)", line)), "")
    for number, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)", summary):
        counts["error" if word.startswith("error") else word] = int(number)
    if not summary:  # killed before its summary: count the progress characters printed so far
        progress = "".join(re.sub(r"\s*\[\s*\d+%\]$", "", line) for line in lines if re.fullmatch(r"[.sFExX]+(\s*\[\s*\d+%\])?", line))
        counts.update(passed=progress.count("."), failed=progress.count("F"), skipped=progress.count("s"), error=progress.count("E"))
    return counts


def not_started_for_time(output: str) -> int:
    """Tests the deadline skipped, from pytest's -rs lines ("SKIPPED [N] file:line: reason"
    groups equal reasons, so N counts them)."""
    return sum(int(count) for count in re.findall(r"SKIPPED \[(\d+)\] [^\n]*not started: past HDCFL_TEST_DEADLINE", output))


def step_cuda_tests(step: Step) -> None:
    cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-rfEs", "-p", "no:cacheprovider"]
    if step.dry_run:  # collect only, and only the files that use the mark (the whole suite's collection is slow)
        cmd += ["--collect-only", *sorted(str(f.relative_to(REPO)) for f in (REPO / "tests").rglob("test_*.py") if "mark.cuda" in f.read_text())]
    elif importlib.util.find_spec("xdist") is not None:  # a few cases at a time: one private Ray instance per worker
        cmd += ["-n", str(CUDA_TEST_WORKERS)]
    # no test starts after this (tests/conftest.py skips it), so that every case that ran ran whole:
    # one cut off by the step's SIGTERM would stop its run and read as a failure
    os.environ["HDCFL_TEST_DEADLINE"] = str(step.deadline - CUDA_TEST_LONGEST_S)
    result = run_command(cmd, step.left())
    counts = parse_pytest(result["output_tail"])
    not_started = not_started_for_time(result["output_tail"])
    failed_tests = re.findall(r"^(?:FAILED|ERROR) (\S+)", result["output_tail"], flags=re.MULTILINE)
    step.record(**counts, not_started_for_time=not_started, failed_tests=failed_tests, **result)
    if step.dry_run and (result["returncode"] != 0 or not counts.get("collected")):
        raise RuntimeError("pytest could not collect the cuda tests")
    if step.dry_run:
        return
    if result["timed_out"] or result["returncode"] != 0:
        raise RuntimeError("pytest timed out" if result["timed_out"] else f"pytest exited {result['returncode']}: {failed_tests}")
    if not_started:
        step.warn(f"{not_started} cuda test(s) not started within the step's budget (counted as skipped); "
                  "python -m pytest -m cuda runs them all")


def step_throughput(step: Step) -> None:
    import warnings

    import torch
    from benchmarks._workload import cifar_clients, cifar_model
    from hdcfl_ray.config.schema import RuntimeConfig
    from hdcfl_ray.contract import OptimizerConfig
    from hdcfl_ray.runtime.client.device import choose_device, configure_cuda
    from hdcfl_ray.training.local_training import train_locally
    from hdcfl_ray.training.precision import autocast

    warnings.filterwarnings("ignore")  # deterministic-kernel notices (ResNet's pooling backward)
    runtime = RuntimeConfig(num_gpus_per_actor=0.0 if step.dry_run else 1.0)  # a host's defaults: deterministic, no TF32
    device = choose_device(runtime)
    configure_cuda(runtime, device)
    images, batch, warmup = (8, 4, 1) if step.dry_run else (10_000, 32, 20)
    ((inputs, labels),) = cifar_clients(1, images, device=device, uniform=True)
    config = OptimizerConfig(name="sgd", lr=0.05, momentum=0.9, weight_decay=5e-4)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def project(model: Any, x: torch.Tensor, y: torch.Tensor, precision: str) -> int:
        with autocast(precision, device):  # as a client host runs its hooks
            stats = train_locally(model, x, y, epochs=1, batch_size=batch, optimizer_config=config, generator=torch.Generator().manual_seed(1))
        return stats.samples_processed

    def plain(model: Any, x: torch.Tensor, y: torch.Tensor, precision: str) -> int:
        model.encoder.train(), model.head.train()
        optimizer = torch.optim.SGD([*model.encoder.parameters(), *model.head.parameters()], lr=0.05, momentum=0.9, weight_decay=5e-4)
        order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(1)).to(device)
        for start in range(0, x.shape[0], batch):
            index = order[start : start + batch]
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                loss = torch.nn.functional.cross_entropy(model.head(model.encoder(x[index])), y[index])
            loss.backward()
            optimizer.step()
        return int(x.shape[0])

    results: list[dict[str, Any]] = []
    step.record(device=str(device), images=images, batch_size=batch, warmup_steps=warmup, results=results,
                note="one epoch each after warm-up steps; deterministic kernels, no TF32 (the hosts' defaults)")
    for encoder, precision in [(encoder, precision) for encoder in ENCODERS for precision in ("fp32", "bf16")]:
        entry: dict[str, Any] = {"encoder": encoder, "precision": precision}
        try:
            for name, loop in (("plain", plain), ("project", project)):
                if step.left() < 5:
                    raise TimeoutError("skipped: out of time")
                model = cifar_model(ENCODERS[encoder], device)
                loop(model, inputs[: warmup * batch], labels[: warmup * batch], precision)
                sync()
                started = time.perf_counter()
                samples = loop(model, inputs, labels, precision)
                sync()
                entry[f"{name}_samples_per_s"] = round(samples / (time.perf_counter() - started), 1)
            entry["ratio_project_over_plain"] = round(entry["project_samples_per_s"] / entry["plain_samples_per_s"], 3)
        except Exception as error:  # one configuration failing leaves the others measured
            entry["error"] = f"{type(error).__name__}: {error}"
        results.append(entry)
        step.record(results=results)
    if any("error" in entry for entry in results):
        raise RuntimeError("; ".join(f"{e['encoder']} {e['precision']}: {e['error']}" for e in results if "error" in e))


def step_paper_round(step: Step) -> None:
    """benchmarks/gpu_round.py in a process of its own, within this step's budget."""
    out = step.work / "gpu_round.json"
    command = [sys.executable, "-m", "benchmarks.gpu_round", "--budget", str(max(10.0, step.left() - 30)), "--out", str(out),
               *(["--dry-run"] if step.dry_run else [])]
    result = run_command(command, step.left())
    measured = json.loads(out.read_text()) if out.is_file() else {}
    step.record(run={key: result[key] for key in ("cmd", "returncode", "timed_out", "seconds")}, **{
        key: measured[key] for key in ("sizes", "modes", "ray", "ceilings", "bit_identity", "step_profile", "default_plan", "layouts",
                                       "outside_step_loop", "round_overhead", "skipped") if key in measured
    })
    if result["returncode"] != 0:
        step.record(log_tail=result["output_tail"][-1500:])
        raise RuntimeError(f"gpu_round.py exited {result['returncode']}" + (" (timed out)" if result["timed_out"] else ""))


def compare_clients_tables(first: Any, second: Any) -> dict[str, Any]:
    """Whether two clients tables (pyarrow) hold the same bits in every accuracy and loss
    column, rows matched by (round, client_id); NaN equals NaN of the same bits."""
    import struct

    def rows(table: Any, columns: list[str]) -> list[tuple[Any, ...]]:
        data = table.select(["round", "client_id", *columns]).to_pydict()
        return sorted(zip(*(data[name] for name in ["round", "client_id", *columns])))

    def bits(value: Any) -> Any:
        return struct.pack("<d", value) if isinstance(value, float) else value

    columns = [name for name in first.column_names if name.startswith(("accuracy", "loss", "train_loss"))]
    a, b = rows(first, columns), rows(second, columns)
    differing = [name for i, name in enumerate(columns) if len(a) != len(b) or any(bits(x[i + 2]) != bits(y[i + 2]) for x, y in zip(a, b))]
    largest = {name: max((abs(x[i + 2] - y[i + 2]) for x, y in zip(a, b) if isinstance(x[i + 2], float) and isinstance(y[i + 2], float)),
                         default=None) for i, name in enumerate(columns) if name in differing}
    return {"bit_identical": len(a) == len(b) and not differing, "rows": [len(a), len(b)], "columns_compared": columns,
            "columns_differing": differing, "largest_difference": largest}


def step_bit_identity(step: Step) -> None:
    from hdcfl_ray.config.loading import load_scenario
    from hdcfl_ray.logs.table_writer import read_table
    load_scenario(REPO / QUICKSTART, QUICK_OVERRIDES)  # the exact overrides pass the schema
    sets = [arg for value in QUICK_OVERRIDES for arg in ("--set", value)]
    if step.dry_run:
        step.record(validate=run_command([*cli_command(), "validate", QUICKSTART, *sets, "--set", CPU_SHARE], step.left()))
        if step.data["validate"]["returncode"] != 0:
            raise RuntimeError(f"hdcfl-ray validate exited {step.data['validate']['returncode']}")
        return
    runs = []
    for index in (1, 2):
        result = run_command([*cli_command(), "simulate", QUICKSTART, *sets, "--out", str(step.work / f"run-{index}"), "--quiet"], step.left())
        runs.append(result)
        step.record(runs=runs)
        if result["returncode"] != 0:
            raise RuntimeError(f"simulate run {index} exited {result['returncode']}")
    comparison = compare_clients_tables(read_table(step.work / "run-1", "clients"), read_table(step.work / "run-2", "clients"))
    step.record(**comparison)
    if not comparison["bit_identical"]:
        raise RuntimeError(f"two same-seed GPU runs differ in {comparison['columns_differing']}")


def step_paper(step: Step) -> None:
    import pyarrow.parquet as pq
    from hdcfl_ray.config.loading import load_scenario
    from hdcfl_ray.runtime.driver import prepare_run

    cifar, looked = find_cifar(step.cifar)
    step.record(data=str(cifar) if cifar else None, looked_in=looked, overrides=paper_overrides(str(cifar or "CIFAR")),
                layout_overrides=PAPER_LAYOUTS)
    for extra in PAPER_LAYOUTS.values():  # the exact overrides of each layout pass the schema
        load_scenario(REPO / PAPER, [*paper_overrides(str(cifar or "/nonexistent")), *extra])
    if cifar is None:
        message = f"CIFAR-10 Parquet folder not found (looked in {looked}); pass --cifar PATH or set HDCFL_CIFAR10_PARQUET"
        if step.dry_run:
            return step.warn(message)
        raise FileNotFoundError(message)
    if step.dry_run:  # the files' columns, then every check simulate makes, on a slice of the data and the CPU
        step.record(columns={part: pq.read_schema(cifar / f"{part}.parquet").names for part in ("train", "test")})
        sliced = [*paper_overrides(str(cifar)), CPU_SHARE, "dataset.max_train_samples=2000", "dataset.max_test_samples=1000"]
        prepare_run(load_scenario(REPO / PAPER, sliced))
        return
    layouts: dict[str, Any] = {}
    for name, extra in PAPER_LAYOUTS.items():
        first = next(iter(layouts.values()), None)
        if first is not None and step.left() < first["wall_s"] + 15:  # the first layout's run tells what one costs
            step.warn(f"layout {name} not run: {step.left():.0f} s left, one run took {first['wall_s']} s")
            continue
        layouts[name] = paper_layout_run(step, cifar, name, extra)
        step.record(layouts=layouts)
        if layouts[name]["run"]["returncode"] != 0:
            result = layouts[name]["run"]
            raise RuntimeError(f"simulate ({name}) exited {result['returncode']}" + (" (timed out)" if result["timed_out"] else ""))
    default, shared = layouts.get("one_host_per_gpu"), layouts.get("four_hosts_per_gpu")
    step.record(**{key: default[key] for key in ("run", "wall_s", "rounds", "round_wall_s", "samples_trained", "samples_per_s",
                                                 "final_mean_accuracy") if key in default})
    if shared is not None and "round_wall_s" in default and "round_wall_s" in shared:  # above 1: the shared layout's round took longer
        step.record(round_s_shared_over_default=[round(b / a, 3) for a, b in zip(default["round_wall_s"], shared["round_wall_s"])])


def paper_layout_run(step: Step, cifar: Path, name: str, extra: list[str]) -> dict[str, Any]:
    """Two rounds of the paper scenario in one layout: its round times and which clients trained together."""
    from hdcfl_ray.logs.table_writer import read_table

    sets = [arg for value in [*paper_overrides(str(cifar)), *extra] for arg in ("--set", value)]
    run_dir = step.work / f"paper-run-{name}"
    result = run_command([*cli_command(), "simulate", PAPER, *sets, "--out", str(run_dir), "--quiet"], step.left())
    record: dict[str, Any] = {"overrides": extra, "run": result, "wall_s": result["seconds"]}
    if not (run_dir / "rounds.parquet").is_file():
        return record
    table = read_table(run_dir, "rounds").sort_by("round").to_pydict()
    evaluated = [acc for acc, done in zip(table["mean_accuracy"], table["evaluated"]) if done]
    record.update(rounds=table["round"], round_wall_s=table["wall_time_s"], samples_trained=table["samples_trained"],
                  samples_per_s=[round(n / t, 1) for n, t in zip(table["samples_trained"], table["wall_time_s"])],
                  final_mean_accuracy=evaluated[-1] if evaluated else None,
                  layout=run_layout(run_dir))
    return record


def printed_layouts(record: dict[str, Any]) -> list[str]:
    """The layout lines of a step's record: paper_round's runs ("layouts": name -> layout)
    and paper_rot_two_rounds' ("layouts": name -> run, its "layout" inside); then the share
    of a batched round spent outside the step loop where the step measured it."""
    lines: list[str] = []
    for name, entry in (record.get("layouts") or {}).items():
        layout = entry.get("layout", entry) if isinstance(entry, dict) else None
        if isinstance(layout, dict) and "rounds" in layout and "hosts" in layout:
            lines.extend(layout_lines(name, layout))
    if isinstance(record.get("round_overhead"), dict):
        from benchmarks.gpu_round import outside_step_loop_line

        lines.append(outside_step_loop_line(record["round_overhead"]))
    elif "outside_step_loop" in record:
        lines.append("outside the step loop: not measured")
    return lines


STEPS: dict[str, Callable[[Step], None]] = {
    "machine": step_machine, "cuda_tests": step_cuda_tests, "throughput": step_throughput,
    "paper_round": step_paper_round, "bit_identity": step_bit_identity, "paper_rot_two_rounds": step_paper,
}


def child(args: argparse.Namespace) -> int:
    """Run one step in this process (started by the orchestrator with a timeout)."""
    step = Step(args.step, Path(args.step_file), args.deadline, args.dry_run, args.cifar)
    step.record()
    try:
        STEPS[args.step](step)
        step.record(status="dry_run" if args.dry_run else "ok")
        return 0
    except Exception as error:
        step.record(status="failed", error=f"{type(error).__name__}: {error}", traceback=traceback.format_exc()[-2000:])
        return 1
    finally:
        shutil.rmtree(step.work, ignore_errors=True)


def default_out() -> Path:
    return Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT") else REPO / "runs/gpu_check/gpu_check.json"


def orchestrate(args: argparse.Namespace) -> int:
    """Every chosen step in its own process with its budget; the JSON after each."""
    out = Path(args.out) if args.out else default_out()
    budgets = DRY_BUDGETS if args.dry_run else BUDGETS
    chosen = args.steps.split(",") if args.steps else list(STEPS)
    unknown = [name for name in chosen if name not in STEPS]
    if unknown:
        print(f"error: unknown step(s) {unknown}; steps: {', '.join(STEPS)}", file=sys.stderr)
        return 2
    began = time.time()
    total = sum(budgets.values()) if args.dry_run else (args.total_budget or TOTAL_BUDGET_S)
    report: dict[str, Any] = {"check": "hdcfl-ray gpu_check", "mode": "dry_run" if args.dry_run else "gpu", "command": " ".join(["python -m benchmarks.gpu_check", *sys.argv[1:]]),
                              "started": dt.datetime.now().isoformat(timespec="seconds"), "total_budget_s": total, "ok": None,
                              **{name: {"status": "pending" if name in chosen else "not_chosen", "budget_s": budgets[name],
                                        "dry_run": args.dry_run} for name in STEPS}}
    write_json(out, report)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        for name in chosen:
            budget = min(budgets[name], began + total - time.time() - GRACE_S)
            no_gpu = not args.dry_run and report["machine"].get("cuda_available") is False
            if budget < 10 or no_gpu:
                report[name].update(status="skipped", error="no CUDA GPU" if no_gpu else f"out of time ({total:.0f} s total)")
            else:
                cmd = [sys.executable, "-m", "benchmarks.gpu_check", "--step", name, "--step-file", f"{work}/{name}.json",
                       "--deadline", str(time.time() + budget), *(["--dry-run"] if args.dry_run else []),
                       *(["--cifar", args.cifar] if args.cifar else [])]
                result = run_command(cmd, budget + GRACE_S)
                record = json.loads(Path(work, f"{name}.json").read_text()) if Path(work, f"{name}.json").is_file() else {}
                if result["timed_out"] or record.get("status") == "running":
                    record.update(status="timed_out", error=f"killed after its {budget:.0f} s budget")
                elif result["returncode"] != 0 and record.get("status") not in ("failed",):
                    record.update(status="failed", error=f"step process exited {result['returncode']}")
                if record.get("status") in ("failed", "timed_out"):
                    record["log_tail"] = result["output_tail"][-1500:]
                report[name].update(record, seconds=result["seconds"], budget_s=round(budget))
            write_json(out, report)
            print(f"[gpu_check] {name}: {report[name]['status']} ({report[name].get('seconds', 0)} s)"
                  + (f" - {report[name]['error']}" if report[name].get("error") else ""), flush=True)
            for line in printed_layouts(report[name]):
                print(f"[gpu_check]   {line}", flush=True)
            for warning in report[name].get("warnings", []):
                print(f"[gpu_check]   warning: {warning}", flush=True)
    passed = "dry_run" if args.dry_run else "ok"
    report.update(ok=all(report[name]["status"] == passed for name in chosen), finished=dt.datetime.now().isoformat(timespec="seconds"),
                  wall_s=round(time.time() - began, 1))
    write_json(out, report)
    print(f"[gpu_check] {'all steps passed' if report['ok'] else 'some steps did not pass'}; wrote {out}", flush=True)
    return 0 if report["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="everything but CUDA, tiny sizes, on this machine")
    parser.add_argument("--out", default=None, help="the JSON (default: $OUT/gpu_check.json, else runs/gpu_check/gpu_check.json)")
    parser.add_argument("--cifar", default=None, help="the CIFAR-10 Parquet folder (train.parquet, test.parquet)")
    parser.add_argument("--steps", default=None, help=f"comma-separated subset of: {', '.join(STEPS)}")
    parser.add_argument("--total-budget", type=float, default=None,
                        help=f"seconds for all chosen steps together on the GPU (default {TOTAL_BUDGET_S}); for a lease with less time left")
    parser.add_argument("--step", choices=list(STEPS), help=argparse.SUPPRESS)  # the orchestrator's child processes
    parser.add_argument("--step-file", help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    return child(args) if args.step else orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
