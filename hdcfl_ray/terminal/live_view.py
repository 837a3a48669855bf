"""The rich live view of a run (progress with ETA, current accuracies, groups at
the last refresh) and the summary table at the end. `QuietObserver` prints nothing."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from hdcfl_ray.config.schema import Scenario
from hdcfl_ray.diagnostics.curve_trend import NO_CURVE
from hdcfl_ray.plain_text import plain_text
from hdcfl_ray.terminal.event_lines import condensed_events


def _pct(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{100 * value:.2f}"


def _num(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def note_line(text: str, prefix: str = "") -> str:
    """A notice as a console line: plain text (it may quote an error or a user's value,
    with terminal codes or brackets rich would read as markup) after a yellow `note:`."""
    return f"[yellow]note:[/] {escape(plain_text(prefix + text))}"


class QuietObserver:
    def on_start(self, scenario: Scenario, run_dir: Path, num_hosts: int) -> None:
        pass

    def on_round(self, round_row: dict[str, Any], refresh_row: dict[str, Any] | None, events: list[str]) -> None:
        pass

    def on_finish(self, summary: Any) -> None:
        pass

    def on_notice(self, text: str) -> None:
        """Something the user must know even in a quiet run (e.g. a damaged checkpoint passed over)."""
        Console(stderr=True).print(note_line(text), highlight=False, soft_wrap=True)


class LiveView:
    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console()
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("rounds"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
        )
        self.status = Text("waiting for round 1 ...")
        self.live: Live | None = None
        self.task_id: Any = None
        self.last_evaluated: dict[str, Any] = {}
        self.last_refresh: dict[str, Any] | None = None

    def on_start(self, scenario: Scenario, run_dir: Path, num_hosts: int) -> None:
        self.console.print(
            f"[bold]{scenario.name}[/]: {scenario.algorithm.name} on {scenario.dataset.name}, "
            f"{scenario.partition.num_clients} clients ({scenario.partition.kind}), "
            f"{scenario.clients_per_round()} per round, {num_hosts} client host actor(s), seed {scenario.seed}"
        )
        self.console.print(f"run directory: {run_dir}")
        self._print_layout(scenario, num_hosts)
        self.task_id = self.progress.add_task(scenario.name, total=scenario.protocol.rounds)
        self.live = Live(Group(self.progress, self.status), console=self.console, refresh_per_second=4, transient=False)
        self.live.start()

    def _print_layout(self, scenario: Scenario, num_hosts: int) -> None:
        """Where the clients train: a batched run's participants on a host train as one model."""
        from hdcfl_ray.config.runtime_resolved import trains_batched

        if not trains_batched(scenario.runtime):
            return
        self.console.print(
            f"batched training: a round's participants on each of the {num_hosts} host(s) train as one model "
            "(updates.parquet's trained_together says how many did)",
            highlight=False,
        )

    def on_notice(self, text: str) -> None:
        self.console.print(note_line(text), highlight=False, soft_wrap=True)

    def skip_rounds(self, count: int) -> None:
        """A resumed run starts its progress bar at the checkpoint."""
        if count:
            self.progress.advance(self.task_id, count)
            self.console.print(f"resuming after round {count}")

    def on_round(self, round_row: dict[str, Any], refresh_row: dict[str, Any] | None, events: list[str]) -> None:
        for message in condensed_events(events):
            self.console.print(f"[dim]round {round_row['round']}:[/] {message}", highlight=False)
        if round_row.get("evaluated"):
            self.last_evaluated = round_row
        if refresh_row is not None:
            self.last_refresh = refresh_row
        row = self.last_evaluated
        parts = [
            f"round {row.get('round', '-')}: mean {_pct(row.get('mean_accuracy'))}%",
            f"worst {_pct(row.get('worst_accuracy'))}%",
            f"bottom-20% {_pct(row.get('bottom20_accuracy'))}%",
        ]
        if self.last_refresh is not None:
            sizes = self.last_refresh["group_sizes"]
            parts.append(
                f"groups at round {self.last_refresh['round']}: {len([s for s in sizes if s])} (sizes {sizes}), "
                f"silhouette {_num(self.last_refresh['silhouette'])}"
            )
        self.status.plain = " | ".join(parts)
        self.progress.advance(self.task_id)

    def on_finish(self, summary: Any) -> None:
        if self.live is not None:
            self.live.stop()
            self.console.print()
        self.console.print(summary_table(summary.final_round, summary.last_refresh, summary.scored_on))
        stopped = getattr(summary, "stopped_early", None)
        if stopped:  # privacy.max_epsilon ended the run before protocol.rounds
            self.console.print(f"stopped at the privacy budget after round {summary.rounds}: {stopped}", highlight=False)
        notice = getattr(summary, "curve", NO_CURVE).notice()
        if notice:
            self.console.print(
                notice,
                style="yellow",
                highlight=False,
            )
        chose = getattr(summary, "choice_s", 0.0)
        extra = f", {chose:.1f} s of it choosing the auto knobs" if chose else ""
        self.console.print(f"tables written to {summary.run_dir} in {summary.elapsed_s:.1f} s{extra}")

    def abort(self) -> None:
        if self.live is not None:
            self.live.stop()


def summary_table(final_round: dict[str, Any], last_refresh: dict[str, Any] | None, scored_on: str = "test") -> Table:
    scored = "test" if scored_on == "test" else "validation (held out of the clients' training data)"
    table = Table(title=f"Final round {final_round.get('round', '-')}: client {scored} accuracy (%)")
    table.add_column("model scored")
    for column in ("mean", "worst", "bottom-20%", "gap (pp)"):
        table.add_column(column, justify="right")
    table.add_row(
        # not personalised: every client is scored with what the method shares (FedAvg's whole
        # model, FedAvg-SE's encoder with the client's own head)
        "headline" + (" (personalised)" if final_round.get("personalized") else " (not personalised)"),
        _pct(final_round.get("mean_accuracy")),
        _pct(final_round.get("worst_accuracy")),
        _pct(final_round.get("bottom20_accuracy")),
        _pct(final_round.get("gap")),
    )
    if final_round.get("personalized"):
        table.add_row(
            "global encoder + own head",
            _pct(final_round.get("mean_accuracy_global")),
            _pct(final_round.get("worst_accuracy_global")),
            _pct(final_round.get("bottom20_accuracy_global")),
            "",
        )
    if final_round.get("num_newcomers"):  # partition.newcomers, scored by the method's newcomer rule
        table.add_row(
            f"newcomers ({final_round['num_newcomers']}, never trained)",
            _pct(final_round.get("newcomer_mean_accuracy")),
            _pct(final_round.get("newcomer_worst_accuracy")),
            _pct(final_round.get("newcomer_bottom20_accuracy")),
            "",
        )
    if last_refresh is not None:
        table.caption = (
            f"last refresh (round {last_refresh['round']}): {last_refresh['num_groups']} groups, sizes {last_refresh['group_sizes']}, "
            f"silhouette {_num(last_refresh['silhouette'])}, ARI vs true groups {_num(last_refresh['ari_true'])}, "
            f"personalisation gain {_num(last_refresh['personalization_gain'], 2)} pp "
            f"({_pct(last_refresh['fraction_helped'])}% of clients helped)"
        )
    return table
