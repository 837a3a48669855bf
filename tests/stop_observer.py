"""An observer that stops a run after a given round, as Ctrl-C would (tests of resume)."""

from __future__ import annotations

from hdcfl_ray.terminal.live_view import QuietObserver


class StopAfterRound(QuietObserver):
    def __init__(self, round_index: int) -> None:
        self.round_index = round_index

    def on_round(self, round_row, refresh_row, events):
        if round_row["round"] == self.round_index:
            raise KeyboardInterrupt("stopped by the test")
