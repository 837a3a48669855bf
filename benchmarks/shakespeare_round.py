"""A Shakespeare round: clients per second and peak memory of FedAvg on Shakespeare, against
a plain PyTorch loop training the same model on the same windows with the same batch size
and optimizer, for the same number of samples. Two scenarios:

- `--scenario standin` (default): the stand-in (scenarios/shakespeare.yaml: 32 roles,
  80-character windows, the character LSTM);
- `--scenario plays`: Shakespeare's plays (scenarios/shakespeare-plays.yaml: 100 roles cut as
  LEAF cuts them, the character LSTM; needs the `plays` extra), every role training every
  round (protocol.participation 1.0) so that the plain loop's windows are the round's.

Each side runs as a fresh process, taking turns `--repeats` times; the table holds the
medians. The simulation is timed over its round loop (from round 1's start to the last
round's end, evaluation at the last round and logging included) and, beside it, from
launch to exit; memory is the peak PSS of the process and everything it started.

    python -m benchmarks.shakespeare_round [--scenario standin|plays] [--rounds 5] [--repeats 3] [--backend auto|local|ray] [--out docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import append_markdown, machine_description, print_table, run_measured

REPO = Path(__file__).resolve().parents[1]
# each scenario's file and what the benchmark sets in it besides the method and the rounds
SCENARIOS = {
    "standin": (REPO / "scenarios" / "shakespeare.yaml", []),
    "plays": (REPO / "scenarios" / "shakespeare-plays.yaml", ["protocol.participation=1.0"]),
}
TITLES = {
    "standin": "A Shakespeare round against a plain loop (FedAvg, 32 roles, char LSTM)",
    "plays": "A round of Shakespeare's plays against a plain loop (FedAvg, 100 roles, every role training, char LSTM)",
}
MARK = "SHAKESPEARE_ROW "


def _prepared(rounds: int, backend: str, out_dir: Path, scenario: str = "standin") -> Any:
    from hdcfl_ray.config.loading import load_scenario
    from hdcfl_ray.runtime.driver import prepare_run

    path, settings = SCENARIOS[scenario]
    overrides = [
        *settings,
        "algorithm.name=fedavg",
        f"protocol.rounds={rounds}",
        f"protocol.eval_every={rounds}",
        f"runtime.backend={backend}",
        "checkpoint.every=null",
        f"output.dir={out_dir}",
    ]
    return prepare_run(load_scenario(path, overrides))


def simulation(rounds: int, backend: str, scenario: str = "standin") -> dict[str, Any]:
    from hdcfl_ray.logs.table_writer import read_table
    from hdcfl_ray.runtime.driver import run_simulation

    with tempfile.TemporaryDirectory(prefix="hdcfl-shakespeare-") as work:
        prepared = _prepared(rounds, backend, Path(work), scenario)
        summary = run_simulation(prepared, Path(work) / "run")
        rounds_table = read_table(summary.run_dir, "rounds").to_pydict()
        samples = int(sum(read_table(summary.run_dir, "updates").to_pydict()["num_samples"]))
    rounds_s = float(sum(rounds_table["wall_time_s"]))
    clients = prepared.partition.num_clients
    return {"samples": samples, "rounds_s": rounds_s, "clients_per_s": clients * rounds / rounds_s, "samples_per_s": samples / rounds_s}


def plain_loop(rounds: int, threads: int | None = None, scenario: str = "standin") -> dict[str, Any]:
    """The same model, windows, batch size and optimizer in one loop over all of them."""
    import torch

    from benchmarks._workload import plain_epochs
    from hdcfl_ray.data.transforms import to_float_batch
    from hdcfl_ray.models import build_split_model

    with tempfile.TemporaryDirectory(prefix="hdcfl-shakespeare-") as work:
        prepared = _prepared(rounds, "local", Path(work), scenario)
    settings_of_run, dataset = prepared.scenario, prepared.dataset
    torch.set_num_threads(threads or os.cpu_count() or 1)  # every core by default, as the simulation may use them all
    model = build_split_model(settings_of_run.model, in_channels=1, num_classes=dataset.num_classes, seed=0)
    rows = [index for client in prepared.partition.clients for index in client.train_indices.tolist()]
    inputs = to_float_batch(dataset.train_images[rows])
    labels = torch.as_tensor(dataset.train_labels[rows], dtype=torch.long)
    settings = settings_of_run.protocol.optimizer
    optimizer = torch.optim.SGD([*model.encoder.parameters(), *model.head.parameters()], lr=settings.lr, momentum=settings.momentum)
    batch_size = settings_of_run.protocol.batch_size
    started = time.perf_counter()
    samples = plain_epochs(model, inputs, labels, optimizer, batch_size, rounds * settings_of_run.protocol.local_epochs)
    return {"samples": samples, "samples_per_s": samples / (time.perf_counter() - started)}


def _child(part: str, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.shakespeare_round", "--part", part, "--rounds", str(args.rounds), "--backend", args.backend]
    command += ["--scenario", args.scenario]
    if args.plain_threads is not None:
        command += ["--plain-threads", str(args.plain_threads)]
    measured = run_measured(command, cwd=REPO)
    if measured.returncode != 0:
        raise SystemExit(f"{part} failed:\n{measured.stderr[-3000:]}")
    row = json.loads(next(line for line in measured.stdout.splitlines() if line.startswith(MARK)).removeprefix(MARK))
    return {**row, "wall_s": measured.wall_s, "peak_memory_mb": measured.peak_memory_bytes / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="standin", help="the stand-in (32 roles) or the plays (100 roles)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backend", choices=["auto", "local", "ray"], default="auto")
    parser.add_argument("--out", type=Path, default=None, help="append the table to this Markdown file")
    parser.add_argument("--plain-threads", type=int, default=None, help="torch threads of the plain loop (default: every core)")
    parser.add_argument("--part", choices=["simulation", "plain"], default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part is not None:  # one side, in this fresh process
        if args.part == "simulation":
            row = simulation(args.rounds, args.backend, args.scenario)
        else:
            row = plain_loop(args.rounds, args.plain_threads, args.scenario)
        print(MARK + json.dumps(row))
        return
    measured: dict[str, list[dict[str, Any]]] = {"simulation": [], "plain": []}
    for index in range(args.repeats):
        for part in measured:
            measured[part].append(_child(part, args))
            print(f"run {index + 1} {part}: {measured[part][-1]['samples_per_s']:.0f} samples/s, peak {measured[part][-1]['peak_memory_mb']:.0f} MB", flush=True)
    simulated, plain = measured["simulation"], measured["plain"]
    assert simulated[0]["samples"] == plain[0]["samples"], (simulated[0]["samples"], plain[0]["samples"])
    median = statistics.median
    rows = [
        {
            "scenario": args.scenario,
            "backend": args.backend,
            "plain_threads": args.plain_threads or os.cpu_count(),
            "rounds": args.rounds,
            "samples": plain[0]["samples"],
            "clients_per_s": median(row["clients_per_s"] for row in simulated),
            "simulation_samples_per_s": median(row["samples_per_s"] for row in simulated),
            "plain_loop_samples_per_s": median(row["samples_per_s"] for row in plain),
            "ratio": median(row["samples_per_s"] for row in simulated) / median(row["samples_per_s"] for row in plain),
            "simulation_launch_to_exit_s": median(row["wall_s"] for row in simulated),
            "simulation_peak_mb": median(row["peak_memory_mb"] for row in simulated),
            "plain_loop_peak_mb": median(row["peak_memory_mb"] for row in plain),
            "runs": args.repeats,
        }
    ]
    print_table(rows)
    if args.out is not None:
        command = "python -m benchmarks.shakespeare_round " + " ".join(argument for argument in sys.argv[1:])
        append_markdown(args.out, TITLES[args.scenario], command.strip(), machine_description(), rows)


if __name__ == "__main__":
    main()
