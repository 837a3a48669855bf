"""Kill soak: `hdcfl-ray simulate` killed with SIGKILL at random moments and resumed
with `--resume` each time, on both backends (local, ray) and in both modes (sync,
async). At the end every table must read cleanly and the killed run's per-client
metrics must equal, bit for bit, those of the same scenario run without a kill.

Each case first runs the scenario uninterrupted (the reference), which also gives
the start-up time and the time per round. The killed run then starts; of every
six kills one falls at start-up, one in a checkpoint write and four inside rounds,
in a seeded random order, each at a seeded random moment:

* start-up: a uniform moment within the reference's start-up time (imports, data,
  actors), before any round is logged;
* round: once the attempt has logged a new round, a uniform moment within one more
  round (training, evaluation, Parquet parts, the checkpoint);
* checkpoint: the moment a checkpoint's staging folder appears, i.e. while a
  checkpoint is being written.

After each kill, whatever of the process's session is still alive 3 s later (its
private Ray instance's daemons and workers) is counted and killed, the tables are
read back, and the next attempt resumes. After the
last kill the run is resumed to its end and compared with the reference.

    python -m benchmarks.kill_soak                              # 6 kills x 4 cases
    python -m benchmarks.kill_soak --kills 3 --cases local:sync  # a quick check
    python -m benchmarks.kill_soak --out docs/reliability.md     # append the table

The scenarios are scenarios/quickstart.yaml (sync) and scenarios/async_fedasync.yaml
(async), shrunk with --set so that a case takes minutes on a laptop: 8 clients,
width 8, one local epoch, a checkpoint every round (every server version in async).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks._common import _tree_pids, append_markdown, machine_description, print_table
from hdcfl_ray.logs.schemas import TABLE_SCHEMAS
from hdcfl_ray.logs.table_writer import read_table

REPO = Path(__file__).resolve().parents[1]

SCENARIOS = {"sync": REPO / "scenarios" / "quickstart.yaml", "async": REPO / "scenarios" / "async_fedasync.yaml"}
SMALL = [  # both modes: small enough that a kill-and-resume cycle takes seconds
    "partition.num_clients=8",
    "partition.test_per_client=30",
    "model.width=8",
    "model.feature_dim=32",
    "protocol.local_epochs=1",
    "protocol.batch_size=16",
    "checkpoint.every=1",
]
MODE_SETTINGS = {
    "sync": ["algorithm.hdcfl.activation_round=2", "algorithm.hdcfl.refresh_every=2"],
    "async": [
        "protocol.asynchronous.concurrency=3",
        "protocol.eval_every=4",
        "algorithm.hdcfl.activation_round=4",
        "algorithm.hdcfl.refresh_every=4",
    ],
}
KILL_KINDS = ("startup", "round", "checkpoint")
KILL_PATTERN = ("startup", "checkpoint", "round", "round", "round", "round")  # shuffled per block of six
POLL_S = 0.002
LEFTOVER_GRACE_S = 3.0
# columns that hold wall-clock time, which no two runs share
TIMING_COLUMNS = {"wall_time_s", "aggregate_s", "elapsed_s"}


@dataclass
class Attempt:
    kind: str
    command: str  # "fresh" | "resume"
    killed: bool
    after_s: float
    rounds_logged: int  # round parts on disk right after the kill
    tables_readable: bool
    leftover_processes: int  # processes of the killed session still alive after the kill
    returncode: int | None = None


@dataclass
class CaseResult:
    backend: str
    mode: str
    rounds: int
    attempts: list[Attempt] = field(default_factory=list)
    final_returncode: int | None = None
    tables_readable: bool = False
    clients_identical: bool = False
    final_round_identical: bool = False
    rounds_identical: bool = False
    updates_identical: bool = False
    wall_s: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def kills(self) -> int:
        return sum(attempt.killed for attempt in self.attempts)


def hdcfl_ray() -> str:
    return str(Path(sys.executable).with_name("hdcfl-ray"))


def case_overrides(backend: str, mode: str, rounds: int) -> list[str]:
    return [*SMALL, *MODE_SETTINGS[mode], f"protocol.rounds={rounds}", f"runtime.backend={backend}"]


def set_args(overrides: list[str]) -> list[str]:
    return [arg for text in overrides for arg in ("--set", text)]


def start(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    # Own session: the process's id is its session id, so what it starts (Ray's
    # daemons and workers do not call setsid) can be found and killed after it.
    with open(log, "ab") as handle:
        return subprocess.Popen(command, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)


def kill_session(process: subprocess.Popen[bytes]) -> int:
    """SIGKILL the process; then count and kill what its session left running."""
    session = process.pid
    os.kill(session, signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + LEFTOVER_GRACE_S  # children that watch their parent exit on their own
    while (leftovers := _tree_pids(session) - {session}) and time.monotonic() < deadline:
        time.sleep(0.1)
    if leftovers:
        try:
            os.killpg(session, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in leftovers:  # re-parented members of the session outside its group
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return len(leftovers)


def rounds_logged(run_dir: Path) -> int:
    directory = run_dir / "rounds.parquet"
    return len(list(directory.glob("part-*.parquet"))) if directory.is_dir() else 0


def staging_identity(run_dir: Path) -> tuple[int, int] | None:
    """(inode, mtime) of the checkpoint staging folder, None while there is none."""
    try:
        stat = (run_dir / ".checkpoint.tmp").stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_mtime_ns


def tables_readable(run_dir: Path) -> bool:
    try:
        for table in TABLE_SCHEMAS:
            read_table(run_dir, table)
    except Exception:  # any reader failure is the finding
        return False
    return True


def wait_until(process: subprocess.Popen[bytes], condition: Any, deadline: float) -> bool:
    """Poll until `condition()` or the deadline; False when the process ended first."""
    while process.poll() is None:
        if condition() or time.monotonic() >= deadline:
            return True
        time.sleep(POLL_S)
    return False


def run_to_end(command: list[str], log: Path, timeout_s: float) -> int:
    process = start(command, log)
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_session(process)
        return -9
    finally:
        if process.poll() is not None:
            try:
                os.killpg(process.pid, signal.SIGKILL)  # nothing of a finished run may linger
            except ProcessLookupError:
                pass


def reference_timing(run_dir: Path, wall_s: float) -> tuple[float, float]:
    """(start-up s: from launch to the first logged round, less that round; s per round)
    of the uninterrupted run. `elapsed_s` counts from just before the backend starts."""
    rounds = read_table(run_dir, "rounds").sort_by("round").to_pydict()
    elapsed, first_round = rounds["elapsed_s"], rounds["wall_time_s"][0]
    startup = wall_s - elapsed[-1] + (elapsed[0] - first_round)
    return max(0.5, startup), max(0.05, elapsed[-1] / len(elapsed))


def completed(run_dir: Path) -> bool:
    try:
        return json.loads((run_dir / "manifest.json").read_text()).get("status") == "completed"
    except (OSError, ValueError):
        return False


def soak_case(backend: str, mode: str, rounds: int, kills: int, rng: random.Random, work: Path, timeout_s: float) -> CaseResult:
    result = CaseResult(backend, mode, rounds)
    started = time.monotonic()
    overrides = set_args(case_overrides(backend, mode, rounds))
    name = f"{backend}-{mode}"
    log = work / f"{name}.log"
    reference, killed = work / f"{name}-reference", work / f"{name}-killed"
    fresh = [hdcfl_ray(), "simulate", str(SCENARIOS[mode]), *overrides, "--quiet"]
    resume = [hdcfl_ray(), "simulate", "--resume", str(killed), "--quiet"]

    reference_started = time.monotonic()
    if run_to_end([*fresh, "--out", str(reference)], log, timeout_s) != 0:
        result.problems.append(f"the reference run failed (see {log})")
        return result
    startup_s, round_s = reference_timing(reference, time.monotonic() - reference_started)

    schedule: list[str] = []
    for _ in range(kills * 3):  # bounded: start-up kills make no progress
        if result.kills >= kills or completed(killed):
            break
        if (killed / "scenario.yaml").is_file():
            command, label = resume, "resume"
        else:  # killed before the run folder held its scenario: start the same command again
            if killed.exists():
                shutil.rmtree(killed)
            command, label = [*fresh, "--out", str(killed)], "fresh"
        if not schedule:
            schedule = rng.sample(KILL_PATTERN, len(KILL_PATTERN))
        kind = schedule.pop()
        process = start(command, log)
        attempt_started = time.monotonic()
        give_up = attempt_started + timeout_s  # a hung attempt is killed too, and shows as a failed comparison
        if kind == "startup":
            alive = wait_until(process, lambda: False, attempt_started + rng.uniform(0.0, startup_s))
        elif kind == "round":
            before = rounds_logged(killed)
            alive = wait_until(process, lambda: rounds_logged(killed) > before, give_up)
            alive = alive and wait_until(process, lambda: False, time.monotonic() + rng.uniform(0.0, round_s))
        else:  # a staging folder left by an earlier kill does not count: wait for a new one
            left_over = staging_identity(killed)
            alive = wait_until(process, lambda: staging_identity(killed) not in (None, left_over), give_up)
        if alive and process.poll() is None:
            leftovers = kill_session(process)
            result.attempts.append(
                Attempt(kind, label, True, time.monotonic() - attempt_started, rounds_logged(killed), tables_readable(killed), leftovers)
            )
        else:  # the attempt ended before its moment came
            returncode = process.wait()
            result.attempts.append(
                Attempt(kind, label, False, time.monotonic() - attempt_started, rounds_logged(killed), tables_readable(killed), 0, returncode)
            )
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if returncode != 0:
                result.problems.append(f"an attempt exited with {returncode} (see {log})")
                return result

    if not completed(killed):
        result.final_returncode = run_to_end(resume, log, timeout_s)
        if result.final_returncode != 0:
            result.problems.append(f"the final --resume exited with {result.final_returncode} (see {log})")
            return result
    result.tables_readable = tables_readable(killed)
    compare(result, reference, killed)
    result.wall_s = time.monotonic() - started
    return result


def compare(result: CaseResult, reference: Path, killed: Path) -> None:
    keys = [("round", "ascending"), ("client_id", "ascending")]
    ref_clients = read_table(reference, "clients").sort_by(keys)
    got_clients = read_table(killed, "clients").sort_by(keys)
    columns = [name for name in ref_clients.column_names if name != "host"]  # which actor held a client is not a result
    result.clients_identical = same_rows(ref_clients, got_clients, columns)
    last = max(ref_clients.column("round").to_pylist())
    result.final_round_identical = same_rows(final_rows(ref_clients, last), final_rows(got_clients, last), columns)
    ref_rounds, got_rounds = read_table(reference, "rounds").sort_by("round"), read_table(killed, "rounds").sort_by("round")
    result.rounds_identical = same_rows(ref_rounds, got_rounds, [c for c in ref_rounds.column_names if c not in TIMING_COLUMNS])
    ref_updates, got_updates = read_table(reference, "updates").sort_by(keys), read_table(killed, "updates").sort_by(keys)
    result.updates_identical = same_rows(ref_updates, got_updates, ref_updates.column_names)
    for label, same in (("clients", result.clients_identical), ("rounds", result.rounds_identical), ("updates", result.updates_identical)):
        if not same:
            result.problems.append(f"{label} table differs from the uninterrupted run's")


def final_rows(table: Any, last_round: int) -> Any:
    import pyarrow.compute as pc

    return table.filter(pc.equal(table.column("round"), last_round))


def same_rows(a: Any, b: Any, columns: list[str]) -> bool:
    """Equal row counts and every value equal bit for bit (floats compared by their bytes)."""
    if a.num_rows != b.num_rows:
        return False
    return all(bits(a.column(c).to_pylist()) == bits(b.column(c).to_pylist()) for c in columns)


def bits(value: Any) -> Any:
    if isinstance(value, float):
        return struct.pack("<d", value)
    if isinstance(value, list):
        return [bits(item) for item in value]
    return value


def summary_rows(results: list[CaseResult]) -> list[dict[str, Any]]:
    rows = []
    for result in results:
        kinds = {kind: sum(a.killed and a.kind == kind for a in result.attempts) for kind in KILL_KINDS}
        rows.append(
            {
                "backend": result.backend,
                "mode": result.mode,
                "rounds": result.rounds,
                "kills": result.kills,
                "at start-up / in a round / in a checkpoint write": f"{kinds['startup']} / {kinds['round']} / {kinds['checkpoint']}",
                "tables readable after every kill": all(a.tables_readable for a in result.attempts) and result.tables_readable,
                "clients identical (all rounds)": result.clients_identical,
                "final round identical": result.final_round_identical,
                "rounds, updates identical": result.rounds_identical and result.updates_identical,
                "processes alive 3 s after the kills": sum(a.leftover_processes for a in result.attempts),
                "wall s": round(result.wall_s, 1),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=6, help="SIGKILLs per case (default 6)")
    parser.add_argument("--cases", nargs="+", default=["local:sync", "local:async", "ray:sync", "ray:async"], help="backend:mode pairs")
    parser.add_argument("--sync-rounds", type=int, default=10)
    parser.add_argument("--async-rounds", type=int, default=12, help="server versions of an async run")
    parser.add_argument("--seed", type=int, default=2026, help="seeds the kill moments")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds any one process may take")
    parser.add_argument("--out", help="append the table to this Markdown file")
    parser.add_argument("--keep", help="keep the run folders here (default: a temporary folder, removed)")
    args = parser.parse_args()

    rng = random.Random(args.seed)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="kill-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    results: list[CaseResult] = []
    try:
        for case in args.cases:
            backend, _, mode = case.partition(":")
            rounds = args.sync_rounds if mode == "sync" else args.async_rounds
            print(f"{backend} / {mode}: {args.kills} kills over {rounds} rounds ...", flush=True)
            result = soak_case(backend, mode, rounds, args.kills, rng, work, args.timeout)
            results.append(result)
            for attempt in result.attempts:
                outcome = f"killed after {attempt.after_s:.2f} s" if attempt.killed else f"ended first (exit {attempt.returncode})"
                print(
                    f"  {attempt.command:6s} {attempt.kind:10s} {outcome}; {attempt.rounds_logged} rounds on disk; "
                    f"tables {'readable' if attempt.tables_readable else 'UNREADABLE'}; {attempt.leftover_processes} leftover processes",
                    flush=True,
                )
            for problem in result.problems:
                print(f"  PROBLEM: {problem}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    rows = summary_rows(results)
    print_table(rows)
    total = sum(result.kills for result in results)
    identical = sum(result.kills for result in results if result.clients_identical and not result.problems)
    wall = sum(result.wall_s for result in results)
    print(f"{total} kills tried, {identical} followed by a resume identical to the uninterrupted run; {wall / 60:.1f} min in all")
    if args.out:
        command = "python -m benchmarks.kill_soak " + " ".join(sys.argv[1:])
        append_markdown(args.out, f"Kill soak: {total} kills tried / {identical} identical", command, machine_description(), rows)
    if any(result.problems for result in results):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
