"""A sweep you can watch: a live table of every run's round, accuracy and ETA in a
terminal, plain lines when the output is a file or a pipe."""

from __future__ import annotations

import io

from rich.console import Console

from hdcfl_ray.terminal.sweep_view import SweepView
from tests.conftest import tiny_scenario

ROW = {"round": 1, "evaluated": True, "mean_accuracy": 0.5, "worst_accuracy": 0.25}


def drive(view: SweepView) -> None:
    with view:
        view.on_progress("tiny/hdcfl/seed1", "started")
        view.observer("tiny/hdcfl/seed1").on_round(ROW, None, [])
        view.observer("tiny/hdcfl/seed1").on_round({"round": 2, "evaluated": False}, None, [])
        view.on_progress("tiny/hdcfl/seed2", "skipped (already complete)")


def test_piped_output_is_plain_lines_with_round_accuracy_and_eta():
    out = io.StringIO()
    drive(SweepView([("tiny/hdcfl/seed1", 3), ("tiny/hdcfl/seed2", 3)], Console(file=out, force_terminal=False, width=200)))
    lines = out.getvalue().splitlines()
    assert "[0/2] tiny/hdcfl/seed1: started" in lines
    assert any(line.startswith("[0/2] tiny/hdcfl/seed1: round 1/3, mean 50.00%, worst 25.00%, ETA 0:00:") for line in lines), lines
    assert "[1/2] tiny/hdcfl/seed2: skipped (already complete)" in lines
    assert "\x1b[" not in out.getvalue()  # no terminal control codes in a file


def test_a_terminal_gets_one_live_table_of_the_runs_under_an_overall_bar():
    out = io.StringIO()
    drive(SweepView([("tiny/hdcfl/seed1", 3), ("tiny/hdcfl/seed2", 3)], Console(file=out, force_terminal=True, width=200)))
    text = out.getvalue()
    for header in ("run", "status", "round", "mean %", "worst %", "time", "ETA", "runs"):
        assert header in text, header
    assert "2/3" in text and "50.00" in text and "25.00" in text and "3/3" in text  # seed1 at round 2; seed2 done
    assert "1/2" in text  # the overall bar: one of two runs finished
    assert "round 1/3, mean" not in text  # the table replaces the plain lines


def test_a_piped_sweep_prints_each_runs_rounds_and_its_end(write_scenario, tmp_path):
    from typer.testing import CliRunner

    from cli import app

    path = write_scenario(tiny_scenario(algorithm={"name": "fedavg_se"}, protocol={"rounds": 2}))
    result = CliRunner().invoke(app, ["sweep", str(path), "--seeds", "3", "--out", str(tmp_path / "sweep")])
    assert result.exit_code == 0, result.output
    assert "tiny/fedavg_se/seed3: round 2/2, mean " in result.output, result.output
    assert "[1/1] tiny/fedavg_se/seed3: completed" in result.output
