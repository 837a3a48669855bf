"""SIGTERM and SIGINT (once or twice, Ctrl-C's whole process group) stop `hdcfl-ray
simulate` resumably on both backends: one line naming the run folder and the
resume command (only when the folder exists), the manifest marked `interrupted`,
exit 130 / 143, and no process of the run alive 10 s later. Each case runs the
real command in a process of its own and stops every process it started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cli import app
from tests.conftest import tiny_scenario

REPO = Path(__file__).resolve().parents[1]
COMMAND = [sys.executable, "-c", "import sys; sys.argv[0] = 'hdcfl-ray'; from cli import app; app()"]


def _process_table() -> dict[int, tuple[int, str]]:
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] != "Z":
                table[int(entry)] = (int(fields[1]), fields[19])
    return table


def _tree(root: int) -> dict[int, str]:
    """pid -> start time of `root` and its descendants."""
    table = _process_table()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in table and pid not in found:
            found[pid] = table[pid][1]
            todo.extend(children.get(pid, []))
    return found


def _alive(processes: dict[int, str]) -> list[int]:
    table = _process_table()
    return [pid for pid, started in processes.items() if pid in table and table[pid][1] == started]


class Run:
    """`hdcfl-ray simulate` on a tiny scenario, in a new session (its own process group)."""

    def __init__(self, tmp_path: Path, backend: str, rounds: int = 12) -> None:
        self.out = tmp_path / "run"
        scenario = tmp_path / "scenario.yaml"
        scenario.write_text(yaml.safe_dump(tiny_scenario(protocol={"rounds": rounds}, checkpoint={"every": 1}), sort_keys=False))
        self.start(["simulate", str(scenario), "--set", f"runtime.backend={backend}", "--out", str(self.out), "-q"])

    def start(self, args: list[str]) -> None:
        """`hdcfl-ray ARGS` in its own process group, its output collected."""
        self.process = subprocess.Popen(
            [*COMMAND, *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "COLUMNS": "400"},
        )
        self.seen: dict[int, str] = {}

    def wait_for_round(self, round_index: int, timeout: float = 180.0) -> None:
        part = self.out / "rounds.parquet" / f"part-{round_index:06d}.parquet"
        deadline = time.monotonic() + timeout
        while not part.exists():
            assert self.process.poll() is None, self.output()
            assert time.monotonic() < deadline, "the run did not reach its round in time"
            self.seen.update(_tree(self.process.pid))
            time.sleep(0.2)
        self.seen.update(_tree(self.process.pid))

    def signal(self, signum: int, group: bool = False) -> None:
        self.seen.update(_tree(self.process.pid))
        if group:
            os.killpg(self.process.pid, signum)  # as Ctrl-C in a terminal: every process of the group
        else:
            os.kill(self.process.pid, signum)

    def finish(self, timeout: float = 60.0) -> int:
        try:
            return self.process.wait(timeout=timeout)
        finally:
            self.stop_leftovers()

    def output(self) -> str:
        return self.process.stdout.read().decode() if self.process.poll() is not None else ""

    def stop_leftovers(self) -> None:
        """Kill whatever of this run is still alive, so no test leaves processes behind."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for pid in _alive(self.seen):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def processes_alive_after(self, seconds: float) -> list[int]:
        deadline = time.monotonic() + seconds
        while _alive(self.seen) and time.monotonic() < deadline:
            time.sleep(0.5)
        return _alive(self.seen)


def _manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


def _assert_stopped_resumably(run: Run, code: int, name: str, output: str) -> None:
    assert code == 128 + getattr(signal, name), output
    lines = [line for line in output.splitlines() if line.strip()]
    assert lines[-1] == (
        f"interrupted ({name}); finished rounds are in {run.out}; continue with: hdcfl-ray simulate --resume {run.out}"
    ), output
    assert "Traceback" not in output
    manifest = _manifest(run.out)
    assert manifest["status"] == "interrupted" and manifest["interrupted_by"] == name


def _resume_to_the_end(run_dir: Path, *overrides: str) -> None:
    args = ["simulate", "--resume", str(run_dir), "--quiet"]
    for override in overrides:
        args += ["--set", override]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert _manifest(run_dir)["status"] == "completed"


def test_sigterm_on_the_local_backend_leaves_a_resumable_run(tmp_path):
    run = Run(tmp_path, "local", rounds=6)
    try:
        run.wait_for_round(2)
        run.signal(signal.SIGTERM)
        code = run.finish()
        _assert_stopped_resumably(run, code, "SIGTERM", run.output())
        assert run.processes_alive_after(10) == []
    finally:
        run.stop_leftovers()
    _resume_to_the_end(run.out)


def test_a_double_ctrl_c_on_the_local_backend_leaves_a_resumable_run(tmp_path):
    run = Run(tmp_path, "local")
    try:
        run.wait_for_round(1)
        run.signal(signal.SIGINT, group=True)
        time.sleep(0.3)
        if run.process.poll() is None:
            run.signal(signal.SIGINT, group=True)
        code = run.finish()
        _assert_stopped_resumably(run, code, "SIGINT", run.output())
    finally:
        run.stop_leftovers()


@pytest.mark.slow  # a long end-to-end run: the slow tier (.ci/run runs it after the README's command)
def test_sigterm_on_the_ray_backend_stops_every_ray_process_and_leaves_a_resumable_run(tmp_path):
    run = Run(tmp_path, "ray")
    try:
        run.wait_for_round(1)
        assert len(run.seen) > 3  # the GCS, the raylet, its agents and workers
        run.signal(signal.SIGTERM)
        code = run.finish()
        _assert_stopped_resumably(run, code, "SIGTERM", run.output())
        assert run.processes_alive_after(10) == []
    finally:
        run.stop_leftovers()
    _resume_to_the_end(run.out, "runtime.backend=local")  # a safe key: both backends give the same bits


@pytest.mark.slow
def test_a_double_ctrl_c_on_the_ray_backend_leaves_no_ray_process(tmp_path):
    run = Run(tmp_path, "ray")
    try:
        run.wait_for_round(1)
        run.signal(signal.SIGINT, group=True)
        time.sleep(0.3)
        run.signal(signal.SIGINT, group=True)
        code = run.finish()
        output = run.output()
        # first what a cut-short shutdown leaves: ray::DashboardAgent, ray::RuntimeEnvAgent
        assert run.processes_alive_after(10) == [], output
        _assert_stopped_resumably(run, code, "SIGINT", output)
    finally:
        run.stop_leftovers()


@pytest.mark.slow
@pytest.mark.parametrize("after_s", [2.0, 6.0, 10.0])
def test_ctrl_c_while_ray_starts_never_finishes_the_run_nor_names_a_folder_that_is_not_there(tmp_path, after_s):
    # rounds enough that the run is still going at the last signal time on a fast machine
    run = Run(tmp_path, "ray", rounds=60)
    try:
        time.sleep(after_s)
        run.signal(signal.SIGINT, group=True)
        time.sleep(0.3)
        if run.process.poll() is None:
            run.signal(signal.SIGINT, group=True)
        code = run.finish()
        output = run.output()
        assert code == 130, output
        last = [line for line in output.splitlines() if line.strip()][-1]
        if (run.out / "scenario.yaml").is_file():
            assert "--resume" in last and _manifest(run.out)["status"] == "interrupted" if (run.out / "manifest.json").exists() else True
        else:
            assert last == "interrupted (SIGINT) before the run folder was made; nothing was written", output
        assert run.processes_alive_after(10) == []
    finally:
        run.stop_leftovers()


def test_a_swallowed_stop_signal_is_raised_again_at_the_next_safe_point():
    from hdcfl_ray.runtime.interrupts import RunInterrupted, raise_if_received, stop_signals

    with stop_signals():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.5)
        except KeyboardInterrupt:
            pass  # as code that catches everything would
        with pytest.raises(RunInterrupted) as caught:
            raise_if_received()
        assert caught.value.exit_code == 143
        os.kill(os.getpid(), signal.SIGINT)  # a second one while cleaning up: ignored
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # until the process exits
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_a_second_process_cannot_write_a_locked_run_folder(tmp_path, write_scenario):
    from hdcfl_ray.runtime.driver import run_dir_lock

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    path = write_scenario(tiny_scenario(runtime={"backend": "local"}))
    with run_dir_lock(run_dir):  # another run that has claimed the folder but not written yet
        result = CliRunner().invoke(app, ["simulate", str(path), "--out", str(run_dir), "-q"])
    assert result.exit_code == 2, result.output
    assert "another hdcfl-ray process is writing this run folder" in result.output
    assert sorted(entry.name for entry in run_dir.iterdir()) == [".lock"]
