"""What a sweep shows while it runs: every run's status, round, current mean and
worst accuracy, time and ETA, under an overall bar with an ETA. In a terminal it
is one live rich table; when the output is not a terminal (a log file, a pipe) it
degrades to plain lines: one per status change and one per evaluated round.

Each run of the sweep reports through its own observer (`SweepView.observer`),
called from the sweep's worker threads; the view serialises them."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from hdcfl_ray.diagnostics.curve_trend import NO_CURVE
from hdcfl_ray.terminal.live_view import note_line

FINISHED = ("completed", "skipped", "failed", "stopped", "settings changed")


@dataclass
class RunState:
    key: str
    total_rounds: int
    status: str = "waiting"
    round: int = 0
    mean: float | None = None
    worst: float | None = None
    started_at: float | None = None  # monotonic time of this session's start of the run
    first_round: int = 0  # rounds already on disk when it (re)started
    finished_at: float | None = None

    def eta_s(self, now: float) -> float | None:
        """Seconds left at this session's pace (None before its first round here)."""
        done_here = self.round - self.first_round
        if self.started_at is None or done_here <= 0 or self.status != "running":
            return None
        return (now - self.started_at) / done_here * (self.total_rounds - self.round)

    def elapsed_s(self, now: float) -> float | None:
        if self.started_at is None:
            return None
        return (self.finished_at or now) - self.started_at


class SweepView:
    def __init__(self, runs: list[tuple[str, int]], console: Console | None = None, title: str = "sweep") -> None:
        self.console = console or Console()
        self.states = {key: RunState(key, rounds) for key, rounds in runs}
        self.lock = threading.Lock()
        self.live_mode = self.console.is_terminal
        self.progress = Progress(
            TextColumn(f"[bold]{title}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("runs"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
        )
        self.task_id = self.progress.add_task(title, total=len(runs))
        self.live: Live | None = None

    # ---- lifetime ----
    def __enter__(self) -> "SweepView":
        if self.live_mode:
            self.live = Live(self._renderable(), console=self.console, refresh_per_second=2, transient=False)
            self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.update(self._renderable())
            self.live.stop()
            self.live = None

    # ---- what the sweep runner calls ----
    def on_progress(self, key: str, status: str) -> None:
        """A run's status change, as the sweep runner reports it."""
        with self.lock:
            state = self.states.get(key)
            if state is None:
                return
            word = status.split(" ", 1)[0].rstrip(":")
            if status.startswith("settings changed"):
                word = "settings changed"
            now = time.monotonic()
            if word in ("started", "resuming"):
                state.status, state.started_at = "running", now
            else:
                state.status = word
            if state.status in FINISHED:
                state.finished_at = now
                if word == "skipped":
                    state.round = state.total_rounds
                self.progress.advance(self.task_id)
            self._show(f"{self._counter()} {key}: {status}")

    def observer(self, key: str) -> "RunObserver":
        return RunObserver(self, key)

    # ---- what a run's observer calls ----
    def _on_round(self, key: str, row: dict[str, Any]) -> None:
        with self.lock:
            state = self.states[key]
            state.round = int(row.get("round") or state.round)
            if row.get("evaluated"):
                state.mean, state.worst = row.get("mean_accuracy"), row.get("worst_accuracy")
                eta = state.eta_s(time.monotonic())
                self._show(
                    f"{self._counter()} {key}: round {state.round}/{state.total_rounds}, mean {_pct(state.mean)}%, "
                    f"worst {_pct(state.worst)}%, ETA {_duration(eta)}"
                )
            elif self.live is not None:
                self.live.update(self._renderable())

    def _on_skip(self, key: str, rounds_done: int) -> None:
        with self.lock:
            state = self.states[key]
            state.round = state.first_round = rounds_done

    # ---- rendering ----
    def _show(self, line: str) -> None:
        """A status line: printed as is when not in a terminal, folded into the table in one."""
        if self.live is not None:
            self.live.update(self._renderable())
        elif not self.live_mode:
            self.console.print(line, highlight=False, soft_wrap=True)

    def _counter(self) -> str:
        done = sum(state.status in FINISHED for state in self.states.values())
        return f"[{done}/{len(self.states)}]"

    def table(self) -> Table:
        now = time.monotonic()
        table = Table(expand=False)
        for column in ("run", "status", "round", "mean %", "worst %", "time", "ETA"):
            table.add_column(column, justify="left" if column in ("run", "status") else "right")
        for state in self.states.values():
            table.add_row(
                state.key,
                state.status,
                f"{state.round}/{state.total_rounds}",
                _pct(state.mean),
                _pct(state.worst),
                _duration(state.elapsed_s(now)),
                _duration(state.eta_s(now)),
            )
        return table

    def _renderable(self) -> Group:
        return Group(self.table(), self.progress)


class RunObserver:
    """One sweep run's observer (the driver's observer protocol), forwarding to the view."""

    def __init__(self, view: SweepView, key: str) -> None:
        self.view, self.key = view, key

    def on_start(self, scenario: Any, run_dir: Path, num_hosts: int) -> None:
        pass

    def skip_rounds(self, count: int) -> None:
        self.view._on_skip(self.key, count)

    def on_round(self, round_row: dict[str, Any], refresh_row: dict[str, Any] | None, events: list[str]) -> None:
        self.view._on_round(self.key, round_row)

    def on_finish(self, summary: Any) -> None:
        notice = getattr(summary, "curve", NO_CURVE).notice()
        if notice:
            self.on_notice(notice)

    def on_notice(self, text: str) -> None:
        with self.view.lock:
            self.view.console.print(note_line(text, f"{self.key}: "), highlight=False, soft_wrap=True)


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100 * float(value):.2f}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"
