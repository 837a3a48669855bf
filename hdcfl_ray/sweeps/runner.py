"""Running a sweep: one Ray session for every run, runs in parallel when the
cluster has room for more than one, completed runs skipped, killed runs resumed,
and neither done for a run on disk made with other settings."""

from __future__ import annotations

import math
import signal
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from datetime import datetime
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from hdcfl_ray.auto_knobs.cache import CACHE_FOLDER
from hdcfl_ray.config.schema import RuntimeConfig, Scenario
from hdcfl_ray.errors import failure_text
from hdcfl_ray.data.dataset import ImageDataset
from hdcfl_ray.data.sources import load_dataset
from hdcfl_ray.logs.manifest import MANIFEST, read_manifest, update_manifest
from hdcfl_ray.runtime.backends.ray_session import RaySession
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.runtime.interrupts import received
from hdcfl_ray.sweeps.changes import SettingsChangedError, changed_runs, move_aside, settings_changed_message
from hdcfl_ray.sweeps.grid import SweepRun
from hdcfl_ray.sweeps.index import is_unstarted, run_status, write_index
from hdcfl_ray.terminal.live_view import QuietObserver


class DatasetCache:
    """Decode each (dataset settings, seed) once per sweep, not once per run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._datasets: dict[tuple[str, int, str | None], ImageDataset] = {}

    def get(self, scenario: Scenario) -> ImageDataset:
        id_column = scenario.partition.partition_by
        key = (scenario.dataset.model_dump_json(), scenario.seed, id_column)
        with self._lock:
            if key not in self._datasets:
                self._datasets[key] = load_dataset(scenario.dataset, scenario.seed, id_column)
            return self._datasets[key]


@dataclass
class SweepOutcome:
    completed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


def concurrent_runs(cpus: float, runtime: RuntimeConfig, requested: int | None) -> int:
    """How many runs share the cluster: the user's choice, else one per two actor
    slots (a run with a single host actor gains little from more)."""
    if requested is not None:
        return max(1, requested)
    slots = max(1, int(cpus // runtime.num_cpus_per_actor))
    return max(1, slots // 2)


def run_sweep(
    runs: list[SweepRun],
    out: Path,
    runtime: RuntimeConfig,
    parallel: int | None = None,
    on_progress: Callable[[str, str], None] | None = None,
    replace_changed: bool = False,
    observer_for: Callable[[str], Any] | None = None,
) -> SweepOutcome:
    """Raises SettingsChangedError, before anything runs, when runs on disk were made
    with other settings; with `replace_changed` those are moved aside and run afresh.
    `observer_for(run key)` gives each run's observer (its rounds, for a live view);
    by default runs are quiet."""
    outcome = SweepOutcome()
    statuses = {run.key: run_status(run) for run in runs}
    changed = changed_runs(runs, statuses)
    if changed and not replace_changed:
        raise SettingsChangedError(settings_changed_message(changed, out))
    for key, destination in move_aside(changed, out).items():
        statuses[key] = "pending"
        if on_progress:
            on_progress(key, f"settings changed: the old run moved to {destination}; starting afresh")
    write_index(out, runs, statuses)
    lock = threading.Lock()
    datasets = DatasetCache()
    todo = [run for run in runs if statuses[run.key] != "completed"]
    for run in runs:
        if statuses[run.key] == "completed":
            outcome.skipped.append(run.key)
            if on_progress:
                on_progress(run.key, "skipped (already complete)")
    if not todo:
        return outcome
    with RaySession(runtime) as session:
        workers = min(len(todo), concurrent_runs(session.cpus, runtime, parallel))
        actors_per_run = max(1, math.floor(session.cpus / runtime.num_cpus_per_actor / workers))

        cluster_lost = threading.Event()

        def execute(run: SweepRun) -> str:
            if cluster_lost.is_set() or received() is not None:  # leave the run as it was: a rerun picks it up
                return run.key
            scenario = run.scenario
            if workers > 1:  # share the slots between the concurrent runs
                limit = min(actors_per_run, scenario.runtime.max_actors or actors_per_run)
                scenario = scenario.model_copy(update={"runtime": scenario.runtime.model_copy(update={"max_actors": limit})})
            resume = statuses[run.key] == "partial"
            if not resume and run.run_dir.is_dir() and is_unstarted(run.run_dir):
                (run.run_dir / "scenario.yaml").unlink(missing_ok=True)  # left by a kill before the run began
            with lock:
                statuses[run.key] = "running"
                write_index(out, runs, statuses)
            if on_progress:
                on_progress(run.key, "resuming" if resume else "started")
            try:
                observer = observer_for(run.key) if observer_for is not None else QuietObserver()
                # the sweep's runs of one setting, method and seed share one choice of their auto knobs
                auto_knobs_dir = out.resolve() / CACHE_FOLDER
                run_simulation(prepare_run(scenario, datasets.get(scenario)), run.run_dir, observer, resume=resume, auto_knobs_dir=auto_knobs_dir)
            except Exception as error:  # one failed run must not stop the sweep
                if received() is not None:  # its Ray stopped by a stop signal: the run is marked interrupted
                    return run.key
                if _cluster_gone(session):
                    # The cluster itself is gone (a `ray stop`, a dead head node): every
                    # remaining run would fail the same way, so stop and keep them resumable.
                    cluster_lost.set()
                    with lock:
                        statuses[run.key] = run_status(run)
                        write_index(out, runs, statuses)
                    if on_progress:
                        on_progress(run.key, "stopped: the sweep's Ray cluster is gone")
                    return run.key
                with lock:
                    outcome.failed[run.key] = failure_text(error)
                    statuses[run.key] = "failed"
                    write_index(out, runs, statuses)
                if on_progress:
                    on_progress(run.key, f"failed: {outcome.failed[run.key]}")
                return run.key
            with lock:
                outcome.completed.append(run.key)
                statuses[run.key] = "completed"
                write_index(out, runs, statuses)
            if on_progress:
                on_progress(run.key, "completed")
            return run.key

        executor = ThreadPoolExecutor(max_workers=workers)
        futures = [executor.submit(execute, run) for run in todo]
        try:
            for future in futures:
                future.result()
        except KeyboardInterrupt:  # SIGINT or SIGTERM (interrupts.stop_signals): stop resumably
            executor.shutdown(wait=False, cancel_futures=True)
            _stop_runs_in_flight(futures, session, todo, statuses, lock, out, runs)
            raise
        executor.shutdown(wait=True)
    if cluster_lost.is_set():
        raise ClusterLostError(
            f"the Ray cluster of this sweep stopped after {len(outcome.completed)} completed run(s); "
            f"nothing finished is lost: rerun the same command to continue (index: {out / 'index.json'})"
        )
    return outcome


# How long a stop signal lets the runs in flight reach their next safe point (a Ray
# run's thread notices the signal within half a second, a local run at its next
# round) before the sweep's Ray is stopped under them; as long again after that.
STOP_GRACE_S = 3.0


def _stop_runs_in_flight(
    futures: list[Future],
    session: RaySession,
    todo: list[SweepRun],
    statuses: dict[str, str],
    lock: threading.Lock,
    out: Path,
    runs: list[SweepRun],
) -> None:
    """After a stop signal: let each run in flight unwind (its manifest is marked
    interrupted), stop the sweep's Ray with every process of it, mark interrupted the
    runs whose thread has not unwound by then (a local run in the middle of a long
    round: the process exits under it, and a rerun resumes it from its checkpoint),
    and write the index as the runs stand."""
    wait(futures, timeout=STOP_GRACE_S)
    session.close_for_good()
    wait(futures, timeout=STOP_GRACE_S)
    signum = received()
    by = signal.Signals(signum).name if signum is not None else "KeyboardInterrupt"
    with lock:
        for run in todo:
            if statuses[run.key] != "running":
                continue
            try:
                manifest = read_manifest(run.run_dir) if (run.run_dir / MANIFEST).is_file() else None
                if manifest is not None and manifest.get("status") == "running":
                    update_manifest(run.run_dir, status="interrupted", interrupted_by=by, interrupted_at=datetime.now().isoformat(timespec="seconds"))
                statuses[run.key] = run_status(run)
            except Exception:  # a manifest caught mid-write: the rerun reads the run folder itself
                statuses[run.key] = "partial"
        write_index(out, runs, statuses)


def _cluster_gone(session: RaySession) -> bool:
    try:
        return session.cpus <= 0
    except Exception:  # the cluster cannot even be asked
        return True


class ClusterLostError(RuntimeError):
    """The sweep's Ray cluster died under it; the sweep is resumable as it stands."""
