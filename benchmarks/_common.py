"""Helpers shared by the benchmarks: machine facts, a measured subprocess run, tables.

Only the standard library: the benchmarks must run in any venv, and /proc is read
directly (no psutil).
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import platform
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

SAMPLE_INTERVAL_S = 0.2


REPOSITORY = Path(__file__).resolve().parents[1]


def module_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment with the repository leading PYTHONPATH, so that a child
    started as `python -m benchmarks.NAME` finds the package from the caller's working
    directory (relative paths among its arguments keep what they meant)."""
    python_path = os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")]))
    return {**os.environ, **(extra or {}), "PYTHONPATH": python_path}


def find_cifar(explicit: str | None) -> Path | None:
    """The CIFAR-10 Parquet folder (scripts/cifar10_to_parquet.py builds one): --cifar, else
    $HDCFL_CIFAR10_PARQUET (the scenarios' variable), else $HDCFL_CIFAR10, else
    data/cifar10-parquet in the repository, else shared/data/cifar10-jpeg beside the clone."""
    candidates = [explicit, os.environ.get("HDCFL_CIFAR10_PARQUET"), os.environ.get("HDCFL_CIFAR10"),
                  REPOSITORY / "data" / "cifar10-parquet", REPOSITORY.parent / "shared" / "data" / "cifar10-jpeg"]
    for candidate in (Path(c) for c in candidates if c):
        if (candidate / "train.parquet").is_file():
            return candidate.resolve()
        if explicit:
            return None  # a folder the user named and that is not one: no silent fallback
    return None


def machine_description() -> dict[str, Any]:
    """What a reader needs to compare numbers between machines."""
    description: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gb": _total_memory_gb(),
        "python": platform.python_version(),
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
    }
    for package in ("torch", "ray"):
        try:  # metadata, not import: importing torch or ray here would cost seconds
            description[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return description


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _total_memory_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) * 1024 / 1e9, 1)  # the value is in kB
    except OSError:
        pass
    return None


@dataclass(frozen=True)
class Measured:
    wall_s: float
    peak_memory_bytes: int  # the largest sampled sum of PSS over the process tree
    returncode: int
    stdout: str
    stderr: str


def run_measured(
    cmd: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | Path | None = None, timeout_s: float | None = None
) -> Measured:
    """Run `cmd` to completion; wall time includes start-up, memory is the peak
    PSS summed over the command and everything it started. Past `timeout_s` the
    whole session is killed and the return code is -9.

    PSS (proportional set size) splits shared pages between the processes that
    map them, so summing it over Ray's raylet, GCS and workers does not count the
    shared object store or shared libraries once per process, as RSS would.
    """
    # Output goes to files, not pipes: a full pipe would stall the command while
    # this loop is busy sampling.
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        # Own session: the command's pid is the session id, so everything it starts
        # (Ray daemons included, which do not call setsid) can be found and killed.
        process = subprocess.Popen(
            list(cmd), stdout=out, stderr=err, env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True
        )
        peak = 0
        try:
            while process.poll() is None:
                peak = max(peak, _tree_pss_bytes(process.pid))
                if timeout_s is not None and time.perf_counter() - started > timeout_s:
                    break  # _kill_session below ends it
                time.sleep(SAMPLE_INTERVAL_S)
            wall_s = time.perf_counter() - started
        finally:
            _kill_session(process)
        out.seek(0)
        err.seek(0)
        return Measured(wall_s=wall_s, peak_memory_bytes=peak, returncode=process.returncode, stdout=out.read(), stderr=err.read())


def _process_table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, session id) for every process readable now."""
    table: dict[int, tuple[int, int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # it exited between listing and reading
            continue
        # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        table[int(entry.name)] = (int(fields[1]), int(fields[3]))  # state, ppid, pgrp, session
    return table


def _tree_pids(root: int) -> set[int]:
    """The root, its descendants, and any process of its session that was re-parented
    to init after its parent exited (e.g. a Ray worker outliving its raylet)."""
    table = _process_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    same_session = {pid for pid, (_, session) in table.items() if session == root}
    descendants: set[int] = set()
    stack = [root]
    while stack:
        pid = stack.pop()
        if pid not in descendants:
            descendants.add(pid)
            stack.extend(children.get(pid, []))
    return same_session | descendants


def _tree_pss_bytes(root: int) -> int:
    total = 0
    for pid in _tree_pids(root):
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024  # kB
                    break
        except (OSError, ValueError):  # vanished mid-read, or a kernel thread without one
            continue
    return total


def _kill_session(process: subprocess.Popen[Any]) -> None:
    """Kill whatever the command left behind (Ray daemons, stray workers)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already empty
    if process.poll() is None:
        process.wait()


def print_table(rows: Sequence[Mapping[str, Any]]) -> None:
    """A plain aligned table: text columns to the left, numbers to the right."""
    print(_format_table(rows, markdown=False))


def _format_table(rows: Sequence[Mapping[str, Any]], markdown: bool) -> str:
    if not rows:
        return "(no rows)"
    columns = list(dict.fromkeys(key for row in rows for key in row))
    cells = [[_cell(row.get(column)) for column in columns] for row in rows]
    numeric = [all(_is_number(row.get(column)) for row in rows if row.get(column) is not None) for column in columns]
    widths = [max(len(column), *(len(line[i]) for line in cells)) for i, column in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        padded = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return ("| " + " | ".join(padded) + " |") if markdown else "  ".join(padded).rstrip()

    rule = ["-" * w if not markdown else ("-" * (w - 1) + ":" if num else "-" * w) for w, num in zip(widths, numeric)]
    return "\n".join([line(columns), line(rule), *(line(c) for c in cells)])


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1 else f"{value:.2f}"
    return str(value)


def append_markdown(
    path: str | Path, title: str, command: str, machine: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]
) -> None:
    """Append a dated section, so results from several days and machines accumulate."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    machine_text = ", ".join(f"{key} {value}" for key, value in machine.items() if key != "date")
    section = (
        f"\n## {title} ({stamp})\n\n"
        f"Command: `{command}`\n\n"
        f"Machine: {machine_text}\n\n"
        f"{_format_table(rows, markdown=True)}\n"
    )
    with path.open("a") as handle:
        handle.write(section)


def table_provenance(repo: Path | None = None) -> str:
    """One line for the foot of a written table: the commit, CPU, torch and Ray it was made with."""
    from hdcfl_ray.logs.manifest import git_dirty, git_revision

    root = repo or REPOSITORY
    revision = git_revision(root)
    commit = revision[:10] if revision else "unrecorded"
    commit += " (with uncommitted changes)" if git_dirty(root) else ""
    machine = machine_description()
    return (f"Made at commit {commit} on {machine['cpu']} ({machine['cores']} cores), torch {machine.get('torch', 'unrecorded')}, "
            f"Ray {machine.get('ray', 'unrecorded')}, {machine['date'][:10]}.")
