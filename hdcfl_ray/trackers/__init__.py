"""Experiment trackers (`output.trackers: [tensorboard, mlflow, wandb]`): each receives
the resolved scenario as parameters, every round's metrics (the row the run writes
to rounds.parquet, plus the refresh row where there is one) and, at the end, the
run's tables as artefacts.

Trackers are optional extras (`pip install -e ".[tensorboard]"`, `[mlflow]`,
`[wandb]`), imported only when a scenario names them; the names are a fixed list
(nothing is imported because a scenario file names it). They are offline by
default. A tracker that fails is reported once and dropped for the rest of the
run: the run and its Parquet tables carry on regardless.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import warnings
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.logs.summary_columns import ACCURACY_SUMMARY_COLUMNS
from hdcfl_ray.plain_text import plain_text
from hdcfl_ray.trackers.base import STATE_FILE, Tracker, TrackerContext

if TYPE_CHECKING:
    from hdcfl_ray.config.schema import Scenario

# name -> (module of its Tracker, the package it needs, the extra that installs it)
TRACKERS: dict[str, tuple[str, str, str]] = {
    "tensorboard": ("hdcfl_ray.trackers.tensorboard", "tensorboard", "tensorboard"),
    "mlflow": ("hdcfl_ray.trackers.mlflow", "mlflow", "mlflow"),
    "wandb": ("hdcfl_ray.trackers.wandb", "wandb", "wandb"),
}

# rounds.parquet columns sent every round (those that are numbers in that round)
ROUND_METRICS = (*ACCURACY_SUMMARY_COLUMNS, "num_groups", "ari_true", "mean_train_loss", "num_participants", "samples_trained", "virtual_time", "elapsed_s")
# refresh.parquet columns, sent as refresh/<column> at the rounds that have one (HDC-FL)
REFRESH_METRICS = ("num_groups", "silhouette", "ari_true", "ari_previous", "membership_entropy_normalized", "personalization_gain", "fraction_helped")

__all__ = ["ROUND_METRICS", "TRACKERS", "Tracker", "TrackerContext", "round_metrics", "with_trackers"]


def check_trackers_installed(names: tuple[str, ...]) -> None:
    missing = [name for name in names if importlib.util.find_spec(TRACKERS[name][1]) is None]
    if missing:
        extras = ",".join(TRACKERS[name][2] for name in missing)
        raise ScenarioError(
            f"output.trackers: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed; "
            f'pip install -e ".[{extras}]" or leave {"it" if len(missing) == 1 else "them"} out of output.trackers'
        )


def with_trackers(scenario: "Scenario", run_dir: Path, observer: Any) -> Any:
    """`observer`, also feeding the scenario's trackers (unchanged when it names none).
    Raises ScenarioError, before anything starts, when a tracker's package is missing."""
    names = tuple(dict.fromkeys(scenario.output.trackers))
    if not names:
        return observer
    check_trackers_installed(names)
    return TrackingObserver(observer, scenario, run_dir, names)


def round_metrics(round_row: dict[str, Any], refresh_row: dict[str, Any] | None = None) -> dict[str, float]:
    """The numbers of a round's row (and refresh row), by column name; absent and NaN values left out."""
    metrics = {key: _number(round_row.get(key)) for key in ROUND_METRICS}
    if refresh_row is not None:
        metrics.update({f"refresh/{key}": _number(refresh_row.get(key)) for key in REFRESH_METRICS})
    return {key: value for key, value in metrics.items() if value is not None}


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


class _Active:
    """The trackers still working, and how to report a failure; shared with the
    finaliser that ends them as failed when a run stops with an error."""

    def __init__(self, notify: Any) -> None:
        self.trackers: dict[str, Tracker] = {}
        self.notify = notify
        self.context: TrackerContext | None = None

    def call(self, name: str, what: str, method: str, *args: Any) -> None:
        tracker = self.trackers.get(name)
        if tracker is None:
            return
        try:
            getattr(tracker, method)(*args)
        except Exception as error:  # a tracker never stops the run nor touches its tables
            self.trackers.pop(name, None)
            self.notify(
                f"tracker {name}: {what} failed ({type(error).__name__}: {error}); it is left out for the rest of "
                "this run (the run and its Parquet tables are not affected)"
            )

    def finish_all(self, status: str) -> None:
        for name in list(self.trackers):
            self.call(name, "finishing", "finish", status)
        self.trackers.clear()
        if self.context is not None and self.context.state:
            try:
                (self.context.run_dir / STATE_FILE).write_text(json.dumps(self.context.state, indent=2, sort_keys=True))
            except OSError as error:
                self.notify(f"trackers: cannot write {STATE_FILE} ({error})")


class TrackingObserver:
    """Wraps the run's observer: every call reaches it unchanged, and the trackers too."""

    def __init__(self, inner: Any, scenario: "Scenario", run_dir: Path, names: tuple[str, ...]) -> None:
        self._inner = inner
        self._scenario = scenario
        self._run_dir = Path(run_dir)
        self._names = names
        self._active = _Active(self._notify)
        # a run that raises never reaches on_finish: its trackers end as failed when
        # this observer is released (or at exit), with the tables written so far
        self._finaliser = weakref.finalize(self, _Active.finish_all, self._active, "failed")

    def __getattr__(self, name: str) -> Any:  # skip_rounds, on_notice, abort: as the wrapped observer has them
        if name.startswith("_") or self._inner is None:
            raise AttributeError(name)
        return getattr(self._inner, name)

    def _notify(self, text: str) -> None:
        text = plain_text(text)  # it quotes a tracker's error, which may carry terminal codes
        if self._inner is not None and hasattr(self._inner, "on_notice"):
            self._inner.on_notice(text)
        else:
            warnings.warn(text, RuntimeWarning, stacklevel=2)

    def on_start(self, scenario: "Scenario", run_dir: Path, num_hosts: int) -> None:
        context = TrackerContext.create(self._scenario, self._run_dir)
        self._active.context = context
        for name in self._names:
            try:
                module = importlib.import_module(TRACKERS[name][0])
                self._active.trackers[name] = module.Tracker()
            except Exception as error:
                self._notify(f"tracker {name}: cannot be loaded ({type(error).__name__}: {error}); the run goes on without it")
                continue
            self._active.call(name, "starting", "start", context)
        if self._inner is not None:
            self._inner.on_start(scenario, run_dir, num_hosts)

    def on_round(self, round_row: dict[str, Any], refresh_row: dict[str, Any] | None, events: list[str]) -> None:
        metrics = round_metrics(round_row, refresh_row)
        for name in list(self._active.trackers):
            self._active.call(name, f"logging round {round_row.get('round')}", "log_round", int(round_row["round"]), metrics)
        if self._inner is not None:
            self._inner.on_round(round_row, refresh_row, events)

    def on_finish(self, summary: Any) -> None:
        self._finaliser.detach()
        self._active.finish_all("completed")
        if self._inner is not None:
            self._inner.on_finish(summary)
