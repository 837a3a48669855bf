"""scenarios/paper/table3.py --dry-run: the table-3 command (the paper run, its two replays,
the report) runs end to end on the CPU with a tiny Parquet folder, and a rerun reuses
what is finished."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # a long end-to-end run: the slow tier (.ci/run runs it after the README's command)
def test_dry_run_writes_the_three_rows_and_a_rerun_reuses_the_runs(tmp_path: Path) -> None:
    command = [sys.executable, str(ROOT / "scenarios/paper/table3.py"), "--dry-run", "--out", str(tmp_path), "--report", str(tmp_path / "copy.md")]
    first = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    report = (tmp_path / "table3.md").read_text()
    header = next(line for line in report.splitlines() if line.startswith("| Method"))
    assert [cell.strip() for cell in header.split("|")[2:5]] == ["table3-dry", "table3-dry.groups-1", "table3-dry.mix-0"]
    assert (tmp_path / "copy.md").read_text() == report
    second = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0 and " simulate " not in second.stdout and " ablate " not in second.stdout


def test_a_missing_data_folder_is_bad_input(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, str(ROOT / "scenarios/paper/table3.py"), "--cifar", str(tmp_path / "nowhere"), "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert completed.returncode == 2 and "--cifar PATH" in completed.stderr


def _table3_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("table3", ROOT / "scenarios/paper/table3.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_commands_a_100_round_seed_takes_at_the_measured_round_time() -> None:
    table3 = _table3_module()
    assert table3.commands_needed(100, 13.5, 570) == 3  # (570 - 60) // 13.5 = 37 rounds a command
    assert table3.commands_needed(100, 3.0, 570) == 1
    assert table3.commands_needed(100, 600.0, 570) == 100  # at least a round a command


def test_a_step_past_the_budget_is_stopped_as_ctrl_c_stops_it(tmp_path: Path) -> None:
    """The run is stopped resumably at the budget, not killed: it gets SIGINT."""
    import time

    table3 = _table3_module()
    marker = tmp_path / "interrupted"
    script = (
        "import signal, sys, time, pathlib\n"
        f"signal.signal(signal.SIGINT, lambda *a: (pathlib.Path({str(marker)!r}).write_text('yes'), sys.exit(130)))\n"
        "time.sleep(60)\n"
    )
    outcome, seconds = table3.run_until([sys.executable, "-c", script], time.perf_counter() + 1.5)
    assert outcome == "stopped" and seconds < 30 and marker.read_text() == "yes"
