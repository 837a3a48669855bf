"""An observer that stops a run after a given round, as Ctrl-C would (tests of resume)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from hdcfl_ray.terminal.live_view import QuietObserver


class StopAfterRound(QuietObserver):
    def __init__(self, round_index: int) -> None:
        self.round_index = round_index

    def on_round(self, round_row, refresh_row, events):
        if round_row["round"] == self.round_index:
            raise KeyboardInterrupt("stopped by the test")


def resume_after_a_stop(scenario: Any, tmp_path: Path, stop_after: int = 3, on_stopped: Callable[[Path], None] | None = None) -> None:
    """Run `scenario` whole, and again stopped after round `stop_after` and resumed from its
    last checkpoint (`on_stopped` sees the stopped run's folder first); assert the resumed
    run's client scores and training losses are the uninterrupted run's, to the bit."""
    import pyarrow.parquet as pq
    import pytest

    from hdcfl_ray.runtime.driver import prepare_run, run_simulation

    reference, stopped = tmp_path / "reference", tmp_path / "stopped"
    run_simulation(prepare_run(scenario), reference, QuietObserver())
    with pytest.raises(KeyboardInterrupt):
        run_simulation(prepare_run(scenario), stopped, StopAfterRound(stop_after))
    if on_stopped is not None:
        on_stopped(stopped)
    run_simulation(prepare_run(scenario), stopped, QuietObserver(), resume=True)
    keys = [("round", "ascending"), ("client_id", "ascending")]
    ref = pq.read_table(reference / "clients.parquet").sort_by(keys)
    got = pq.read_table(stopped / "clients.parquet").sort_by(keys)
    assert got.num_rows == ref.num_rows
    for column in ("accuracy", "loss", "train_loss"):
        assert got.column(column).to_pylist() == ref.column(column).to_pylist(), column
