"""The driver side of a run: prepare it (every check of the user's input, before a
run directory exists or Ray starts), start its backend, loop over the rounds,
write the run directory and its checkpoints, resume one, and report progress to
an observer."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol

import numpy as np
from hdcfl_ray.auto_knobs.record import RECORD_KEY
from hdcfl_ray.config.loading import scenario_to_yaml
from hdcfl_ray.config.schema import Scenario
from hdcfl_ray.errors import ScenarioError, failure_text, failure_traceback
from hdcfl_ray.durable_files import write_text_durably
from hdcfl_ray.logs.manifest import MANIFEST, read_manifest, update_manifest, write_manifest
from hdcfl_ray.runtime.round_rows import RoundRowBuilder
from hdcfl_ray.checkpoint.store import Checkpoint, CheckpointSearch, DamagedCheckpoint, find_checkpoint, write_checkpoint
from hdcfl_ray.logs.refresh_cache import drop_refresh_caches_after, save_refresh_cache
from hdcfl_ray.logs.table_writer import TableWriter, drop_parts_after, read_table, verify_parts
from hdcfl_ray.diagnostics.curve_trend import NO_CURVE, CurveRises, curve_rises, rounds_curve
from hdcfl_ray.runtime.backends.choice import choose_backend
from hdcfl_ray.runtime.backends.local_backend import LocalBackend
# where a scenario meets the machine (re-exported: callers run what the driver prepares)
from hdcfl_ray.runtime.preflight import PreparedRun, prepare_run  # noqa: F401
from hdcfl_ray.runtime.interrupts import raise_if_received, received

if TYPE_CHECKING:
    from hdcfl_ray.runtime.backends.ray_backend import RayBackend


class RunObserver(Protocol):
    def on_start(self, scenario: Scenario, run_dir: Path, num_hosts: int) -> None: ...

    def on_round(self, round_row: dict[str, Any], refresh_row: dict[str, Any] | None, events: list[str]) -> None: ...

    def on_finish(self, summary: "RunSummary") -> None: ...


@dataclass(frozen=True)
class RunSummary:
    run_dir: Path
    rounds: int
    final_round: dict[str, Any]
    last_refresh: dict[str, Any] | None
    elapsed_s: float  # the whole run's time, the choice of its auto knobs included
    scored_on: str = "test"  # "validation": images held out of each client's training data
    choice_s: float = 0.0  # of elapsed_s, the time spent choosing its auto knobs (0 when read from the cache)
    # why the run ended before protocol.rounds (privacy.max_epsilon), or None; `rounds` then counts those run
    stopped_early: str | None = None
    # how the mean accuracy moved over the rounds logged, resumed ones included
    # (diagnostics/curve_trend.py: whether the curve had flattened)
    curve: CurveRises = NO_CURVE


def default_run_dir(scenario: Scenario) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(scenario.output.dir) / f"{scenario.name}-{scenario.algorithm.name}-seed{scenario.seed}-{stamp}"


def resumable_run(run_dir: Path, overrides: list[str] | None = None) -> Scenario:
    """The resolved scenario of a run folder to resume (with `overrides`, which may
    set only keys that are safe to change), or a ScenarioError saying why not: also
    when scenario.yaml no longer says what the run was started with."""
    from hdcfl_ray.config.loading import load_scenario
    from hdcfl_ray.config.safe_yaml import clip
    from hdcfl_ray.config.safe_keys import ARITHMETIC_KEYS, RERUN_SAFE_KEYS, may_differ

    unsafe = [text.partition("=")[0].strip() for text in overrides or [] if not may_differ(text.partition("=")[0].strip())]
    if unsafe:
        raise ScenarioError(
            f"--resume: --set {clip(', '.join(unsafe))} would change the run's results: only runtime.* keys may be "
            f"overridden, except {', '.join(ARITHMETIC_KEYS)} (and {' and '.join(sorted(RERUN_SAFE_KEYS))}); "
            "start a new run for other settings"
        )
    if not (run_dir / "scenario.yaml").is_file():
        raise ScenarioError(f"--resume {run_dir}: not a run directory (no scenario.yaml)")
    manifest = read_manifest(run_dir)
    if manifest is not None and manifest.get("status") == "completed":
        raise ScenarioError(f"--resume {run_dir}: this run is already complete")
    scenario = load_scenario(run_dir / "scenario.yaml", overrides or [])
    check_resume_settings(run_dir, scenario, manifest)
    return scenario


PRIVACY_RECORD = "privacy"  # manifest.json: the privacy the run computed with and, at its end, the epsilon spent
SCENARIO_RECORD = "scenario_resolved"  # manifest.json and checkpoint state.json: the scenario the run started with
# manifest.json and checkpoint state.json: the values the run chose for its auto knobs
AUTO_KNOBS_RECORD = RECORD_KEY


def scenario_record(scenario: Scenario) -> dict[str, Any]:
    """The resolved scenario as recorded when a run starts, and its fingerprint."""
    import hashlib
    import json

    resolved = scenario.model_dump(mode="json")
    digest = hashlib.sha256(json.dumps(resolved, sort_keys=True).encode("utf-8")).hexdigest()
    return {SCENARIO_RECORD: resolved, "scenario_sha256": digest}


def check_resume_settings(run_dir: Path, scenario: Scenario, manifest: dict[str, Any] | None = None, checkpoint_document: dict[str, Any] | None = None) -> None:
    """Stop (ScenarioError, exit 2) when `scenario` differs from the one the run recorded
    at its start in a key that is not safe to change, naming every such key: rounds
    of two settings must never end up in one run. A run with no record (written by
    an older version) is not checked."""
    from hdcfl_ray.config.setting_changes import setting_changes

    started_with = _recorded_scenario(run_dir, manifest, checkpoint_document)
    if started_with is None:
        return
    changes = setting_changes(started_with, scenario)
    if changes:
        listed = "\n".join(f"  {change.describe()}" for change in changes)
        raise ScenarioError(
            f"--resume {run_dir}: the scenario differs from the one this run started with, in keys that change its results:\n"
            f"{listed}\nResuming would mix rounds of two settings. Undo the edit of {run_dir / 'scenario.yaml'} "
            f"(the settings the run started with are under {SCENARIO_RECORD} in {run_dir / MANIFEST}), "
            "or start a new run with the new settings."
        )


def _recorded_scenario(run_dir: Path, manifest: dict[str, Any] | None, checkpoint_document: dict[str, Any] | None) -> Scenario | None:
    """The scenario a run recorded when it started (manifest, else its checkpoint); None
    for a run written by an older version, or a record this version cannot read (the
    schema moved on: nothing to compare)."""
    from hdcfl_ray.config.loading import build_scenario

    recorded = (manifest or {}).get(SCENARIO_RECORD)
    if not isinstance(recorded, dict):
        recorded = (checkpoint_document or {}).get(SCENARIO_RECORD)
    if not isinstance(recorded, dict):
        return None
    try:
        return build_scenario(recorded, source=f"{run_dir / MANIFEST} ({SCENARIO_RECORD})")
    except ScenarioError:
        return None


LOCK_FILE = ".lock"  # held (flock) by the one process that writes a run folder
# a run killed while writing its scenario leaves only that hidden temporary file: not a run yet
_NOT_A_RUN_YET = frozenset({".scenario.yaml.tmp", LOCK_FILE})


def check_run_dir_free(run_dir: Path) -> None:
    """A new run's folder must be absent or empty, and creatable."""
    if run_dir.is_file() or run_dir.is_symlink() and not run_dir.is_dir():
        raise ScenarioError(f"--out {run_dir}: this is a file, not a folder; give a new run folder")
    if run_dir.is_dir() and any(entry.name not in _NOT_A_RUN_YET for entry in run_dir.iterdir()):
        raise ScenarioError(f"--out {run_dir}: the folder already holds files; choose a new run folder or remove it")
    for parent in run_dir.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ScenarioError(f"--out {run_dir}: {parent} is a file, so the run folder cannot be created there")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise ScenarioError(f"--out {run_dir}: cannot create folders in {parent} (no write permission)")
            break


def claim_run_dir(run_dir: Path) -> bool:
    """Create the folder of a new run; True when it did not exist before."""
    check_run_dir_free(run_dir)
    created = not run_dir.exists()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ScenarioError(f"--out {run_dir}: cannot create the run folder ({exc.strerror or exc})") from None
    return created


@contextmanager
def run_dir_lock(run_dir: Path) -> Iterator[None]:
    """Hold RUN_DIR/.lock (an exclusive flock, released when the process ends however
    it ends), so two processes never write one run folder: a second run or resume
    into it stops with exit 2."""
    import fcntl

    try:
        descriptor = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ScenarioError(f"{run_dir}: cannot write in the run folder ({exc.strerror or exc})") from None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(descriptor)
        raise ScenarioError(
            f"{run_dir}: another hdcfl-ray process is writing this run folder (it holds {run_dir / LOCK_FILE}); "
            "wait for it to end, or give another folder"
        ) from None
    try:
        yield
    finally:
        os.close(descriptor)


@contextmanager
def _new_run_dir(scenario: Scenario, run_dir: Path, resume: bool) -> Iterator[None]:
    """The folder of a new run, with its scenario.yaml, locked while the run writes it.
    Bad input found while the run starts (a ScenarioError before any round was
    logged) removes what was written, so the corrected rerun can use the same folder."""
    if resume:
        with run_dir_lock(run_dir):
            yield
        return
    created = claim_run_dir(run_dir)
    with run_dir_lock(run_dir):
        check_run_dir_free(run_dir)  # again, now that no other process can start a run here
        write_text_durably(run_dir / "scenario.yaml", scenario_to_yaml(scenario))
        try:
            yield
        except ScenarioError:
            if all(entry.name.lstrip(".").startswith(("scenario.yaml", MANIFEST, LOCK_FILE.lstrip("."))) for entry in run_dir.iterdir()):
                for entry in run_dir.iterdir():
                    entry.unlink()
                if created:
                    run_dir.rmdir()
            raise


def run_simulation(
    prepared: PreparedRun,
    run_dir: Path,
    observer: RunObserver | None = None,
    resume: bool = False,
    auto_knobs_dir: Path | None = None,
    allow_layout_change: bool = False,
) -> RunSummary:
    """Run a scenario into `run_dir`; with `resume`, continue the run already there
    from its last checkpoint (rows written after it are replaced, never duplicated).
    Knobs set to `auto` are chosen first, before the run folder exists, or read from
    `auto_knobs_dir` (default the user's cache, auto_knobs/cache.py) where this setting,
    data, code and seed chose them before; a resume applies the choice its run recorded. A batched run
    resumed on other hosts is refused unless `allow_layout_change` (host_layout.py)."""
    scenario = prepared.scenario
    # what the run folder records and a resume compares: the scenario as written (auto, all kept)
    written = prepared.as_written
    if scenario.runtime.portable:  # the driver computes too: the initial weights, the server's maths, local hosts
        from hdcfl_ray.portable import require_pinned_process

        require_pinned_process("the driver process")
    if scenario.output.trackers:  # TensorBoard, MLflow, W&B also receive every round (hdcfl_ray/trackers)
        from hdcfl_ray.trackers import with_trackers

        observer = with_trackers(scenario, run_dir, observer)
    checkpoint: CheckpointSearch | None = None
    if resume:
        # read and verify the checkpoint files before any backend starts: a damaged
        # newest one is passed over for the previous one, and said so
        # the table parts each one keeps must be as they were logged too
        checkpoint = find_checkpoint(run_dir, check=_kept_parts_check(run_dir))
        check_resume_settings(
            run_dir, written, read_manifest(run_dir), checkpoint.found.document if checkpoint.found is not None else None
        )
        _report_damaged_checkpoints(checkpoint, observer)
    choice_s = 0.0
    if prepared.auto_plan is not None:  # choose them; `scenario` stays as written, as the run folder records it
        prepared = with_auto_choices(prepared, run_dir, observer, checkpoint, auto_knobs_dir)
        if checkpoint is None and prepared.auto_knobs is not None and not prepared.auto_knobs.from_cache:
            choice_s = prepared.auto_knobs.elapsed_s
    if choose_backend(scenario.runtime) == "local":
        from hdcfl_ray.runtime.backends.placement import local_host_count

        layout_change = _resumed_layout(run_dir, prepared, checkpoint, local_host_count(scenario.runtime, prepared.partition.num_clients), allow_layout_change)
        with _new_run_dir(written, run_dir, resume):
            summary = _with_choice_time(_run_with(lambda: LocalBackend(prepared), prepared, run_dir, observer, checkpoint, layout_change), choice_s)
            update_manifest(run_dir, status="completed", elapsed_s=summary.elapsed_s, auto_knobs_choice_s=summary.choice_s)
    else:
        # Ray is imported only for a Ray run
        from hdcfl_ray.runtime.backends.placement import count_hosts
        from hdcfl_ray.runtime.backends.ray_backend import RayBackend
        from hdcfl_ray.runtime.backends.ray_session import RaySession

        with RaySession(scenario.runtime) as session:
            # a joined cluster can be measured only now, still before the run directory exists
            hosts = count_hosts(scenario.runtime, prepared.partition.num_clients, session.cpus, session.gpus)
            session.check_capacity(hosts, scenario.runtime)
            layout_change = _resumed_layout(run_dir, prepared, checkpoint, hosts, allow_layout_change)
            with _new_run_dir(written, run_dir, resume):
                summary = _with_choice_time(
                    _run_with(lambda: RayBackend(prepared, session), prepared, run_dir, observer, checkpoint, layout_change), choice_s
                )
                update_manifest(run_dir, status="completed", elapsed_s=summary.elapsed_s, auto_knobs_choice_s=summary.choice_s)
    if observer is not None:
        observer.on_finish(summary)
    return summary


def _with_choice_time(summary: RunSummary, choice_s: float) -> RunSummary:
    """The run's summary with the time its auto knobs took to choose counted in."""
    from dataclasses import replace

    return replace(summary, elapsed_s=summary.elapsed_s + choice_s, choice_s=choice_s)


def _resumed_layout(
    run_dir: Path, prepared: PreparedRun, checkpoint: CheckpointSearch | None, num_hosts: int, allow_change: bool
) -> dict[str, Any] | None:
    """On a resume, the host layout it would start against the one the run recorded:
    None when nothing changes what it computes, the change to record when the user
    allowed it; a refusal (ScenarioError) before anything starts otherwise."""
    if checkpoint is None:
        return None
    from hdcfl_ray.runtime.backends.placement import assign_clients
    from hdcfl_ray.runtime.host_layout import check_resumed_layout, layout_record
    from hdcfl_ray.config.runtime_resolved import trains_batched

    scenario = prepared.scenario
    planned = layout_record(assign_clients(prepared.partition.num_clients, num_hosts), trains_batched(scenario.runtime))
    manifest = read_manifest(run_dir)
    started_with = _recorded_scenario(run_dir, manifest, checkpoint.found.document if checkpoint.found is not None else None)
    resumed_at = (checkpoint.found.round if checkpoint.found is not None else 0) + 1
    return check_resumed_layout(
        run_dir, manifest, planned, started_with.runtime if started_with is not None else None, scenario.runtime, resumed_at, allow_change
    )


def with_auto_choices(
    prepared: PreparedRun, run_dir: Path, observer: RunObserver | None, checkpoint: CheckpointSearch | None, root: Path | None
) -> PreparedRun:
    """`prepared` with its auto knobs at their chosen values: chosen now (or read from
    the cache), or on a resume the values the run recorded when it started."""
    from dataclasses import replace

    from hdcfl_ray.auto_knobs.cache import default_root
    from hdcfl_ray.auto_knobs.choose import choose_auto_knobs
    from hdcfl_ray.auto_knobs.plan import with_values
    from hdcfl_ray.auto_knobs.record import recorded_choice

    assert prepared.auto_plan is not None
    if checkpoint is not None:
        found = checkpoint.found.document if checkpoint.found is not None else None
        record = recorded_choice(prepared.auto_plan, run_dir, read_manifest(run_dir), found)
    else:
        notify = getattr(observer, "on_notice", None) or (lambda text: None)

        from hdcfl_ray.auto_knobs.digests import data_digest
        from hdcfl_ray.runtime.backends.local_host import state_after_first_probe

        def run_candidate(scenario: Scenario, candidate_dir: Path) -> None:  # quietly, on the dataset already loaded
            run_simulation(prepare_run(scenario, prepared.dataset), candidate_dir)

        def probe(scenario: Scenario) -> Any:  # the method's state after round 1's probes, nothing trained
            return state_after_first_probe(prepare_run(scenario, prepared.dataset))

        record = choose_auto_knobs(
            prepared.scenario, prepared.auto_plan, root or default_root(prepared.scenario), notify, run_candidate, probe,
            data_digest(prepared.dataset, prepared.partition),
        )
    from hdcfl_ray.runtime.privacy_plan import resolve_privacy

    chosen = with_values(prepared.scenario, record.choices())
    # the planned releases may depend on the chosen knobs (z for privacy.target_epsilon)
    privacy, _ = resolve_privacy(chosen)
    return replace(prepared, scenario=chosen, written=prepared.as_written, auto_knobs=record, privacy=privacy)


def _auto_knobs_record(prepared: PreparedRun) -> dict[str, Any]:
    """The choice of the run's auto knobs as a checkpoint records it ({} without any),
    so a resume whose manifest was lost still applies it."""
    return {} if prepared.auto_knobs is None else {AUTO_KNOBS_RECORD: prepared.auto_knobs.as_dict()}


def _kept_parts_check(run_dir: Path) -> Callable[[Checkpoint], DamagedCheckpoint | None]:
    """Turns down a checkpoint whose kept table parts (rounds up to its own) are not as
    it recorded them, naming the first such part: a resume from it would end with a
    round missing or unreadable, so an older checkpoint (which redoes that round) is
    used, or the resume stops naming the part."""

    def check(found: Checkpoint) -> DamagedCheckpoint | None:
        recorded = found.document.get("tables")
        problems = verify_parts(run_dir, recorded if isinstance(recorded, dict) else None, found.round or 0)
        if not problems:
            return None
        path, what = problems[0]
        more = f" (and {len(problems) - 1} more part(s))" if len(problems) > 1 else ""
        return DamagedCheckpoint(found.directory, path, f"{what}{more}; {found.directory.name}/ (round {found.round}) keeps it")

    return check


def _report_damaged_checkpoints(search: CheckpointSearch, observer: RunObserver | None) -> None:
    if not search.damaged or observer is None or not hasattr(observer, "on_notice"):
        return
    assert search.found is not None  # find_checkpoint raises when every checkpoint is damaged
    for damaged in search.damaged:
        what = damaged.describe() if damaged.file.parent == damaged.directory else f"table part {damaged.describe()}"
        observer.on_notice(
            f"checkpoint {what}; resuming from the previous checkpoint {search.found.directory} (round {search.found.round})"
        )


def _evaluation_facts(prepared: PreparedRun) -> dict[str, Any]:
    """How many clients each evaluated round scores (protocol.eval_clients): the
    sampled ids are the clients table's rows of any evaluated round; and the newcomers
    (partition.newcomers), scored apart by the method's newcomer rule."""
    from hdcfl_ray.runtime.newcomer_facts import newcomer_facts
    from hdcfl_ray.runtime.server.sampling import evaluation_sample

    num_clients = prepared.partition.num_clients
    facts = newcomer_facts(prepared.scenario)
    scored = len(evaluation_sample(num_clients, prepared.scenario.protocol.eval_clients, prepared.scenario.seed, tuple(facts.get("newcomers", ()))))
    return {"clients_scored": scored, "num_clients": num_clients, "sampled": scored < num_clients - len(facts.get("newcomers", ())), **facts}


def _run_with(
    start_backend: Callable[[], LocalBackend | RayBackend],
    prepared: PreparedRun,
    run_dir: Path,
    observer: RunObserver | None,
    checkpoint: CheckpointSearch | None,
    layout_change: dict[str, Any] | None = None,
) -> RunSummary:
    started = time.perf_counter()
    resume = checkpoint is not None
    if resume and (run_dir / MANIFEST).is_file():
        update_manifest(run_dir, status="running", resumed_at=datetime.now().isoformat(timespec="seconds"))
        if layout_change is not None:  # allowed by the user: kept, so reports mark the run
            from hdcfl_ray.runtime.host_layout import LAYOUT_CHANGES

            update_manifest(run_dir, **{LAYOUT_CHANGES: [*(read_manifest(run_dir) or {}).get(LAYOUT_CHANGES, []), layout_change]})
    else:  # a new run, or a resumed one whose manifest was deleted (it was damaged): write it anew
        from hdcfl_ray.config.pinned_knobs import data_setting_fingerprint, pinned_elsewhere
        from hdcfl_ray.models.pretrained import initialisation_facts
        from hdcfl_ray.runtime.trivial_references import RECORD_KEY as TRIVIAL_REFERENCES, trivial_reference_record

        extra: dict[str, Any] = {
            "status": "running",
            "dataset": _dataset_facts(prepared),
            # what a model that learned nothing federated scores on the same samples (report's reference rows)
            TRIVIAL_REFERENCES: trivial_reference_record(prepared),
            "initialisation": initialisation_facts(prepared.scenario),  # seeded, or which pretrained file
            "evaluation": _evaluation_facts(prepared),
            # the mode, the driver's CPU and the instruction sets its libraries compute with (hosts: client_host_hardware)
            "arithmetic": _arithmetic_facts(prepared.scenario.runtime.portable),
            # the data setting's fingerprint, and pinned knobs whose value was chosen for another one
            "data_setting": data_setting_fingerprint(prepared.scenario),
            "pinned_for_another_setting": pinned_elsewhere(prepared.scenario),
            **scenario_record(prepared.as_written),  # what --resume compares the scenario on disk with
        }
        if prepared.auto_knobs is not None:  # the values `auto` knobs got, how, and at what cost
            extra[AUTO_KNOBS_RECORD] = prepared.auto_knobs.as_dict()
        if prepared.privacy is not None:  # z, C, q, T, delta, the sampler, the accountant, the noise cohort
            from hdcfl_ray.runtime.privacy_plan import privacy_record

            extra[PRIVACY_RECORD] = privacy_record(prepared.privacy)
        if resume:
            extra["manifest_rewritten_at_resume"] = datetime.now().isoformat(timespec="seconds")
        write_manifest(run_dir, seed=prepared.scenario.seed, scenario_name=prepared.scenario.name, extra=extra)
    if checkpoint is not None:
        update_manifest(
            run_dir,
            resumed_from_round=checkpoint.found.round if checkpoint.found is not None else 0,
            damaged_checkpoints=[damaged.describe() for damaged in checkpoint.damaged],
        )
    try:
        backend = start_backend()
        try:
            return _run_rounds(prepared, run_dir, backend, observer, checkpoint, started)
        finally:
            backend.close()
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM (interrupts.RunInterrupted): resumable
        import signal

        signum = received()
        by = signal.Signals(signum).name if signum is not None else (str(exc) or "KeyboardInterrupt")
        update_manifest(run_dir, status="interrupted", interrupted_by=by, interrupted_at=datetime.now().isoformat(timespec="seconds"))
        raise
    except BaseException as exc:
        if received() is not None:  # a sweep's run whose Ray was stopped under it by the signal
            import signal

            update_manifest(
                run_dir, status="interrupted", interrupted_by=signal.Signals(received()).name, interrupted_at=datetime.now().isoformat(timespec="seconds")
            )
        else:
            where = failure_traceback(exc)  # a client's traceback (a Ray worker's too), kept for the post-mortem
            update_manifest(run_dir, status="failed", error=failure_text(exc), **({"error_traceback": where} if where else {}))
        raise


def _run_rounds(
    prepared: PreparedRun,
    run_dir: Path,
    backend: LocalBackend | RayBackend,
    observer: RunObserver | None,
    checkpoint: CheckpointSearch | None,
    started: float,
) -> RunSummary:
    from hdcfl_ray.runtime.backends.host_gpus import host_gpus
    from hdcfl_ray.runtime.batching_record import batching_after_run, batching_at_start
    from hdcfl_ray.runtime.host_layout import layout_record
    from hdcfl_ray.config.runtime_resolved import trains_batched

    scenario = prepared.scenario
    hardware = backend.host_hardware()
    batching = batching_at_start(scenario)
    update_manifest(
        run_dir,
        # per host: its device and the ids of its GPUs (host_gpus.py)
        runtime={**backend.describe(), "hosts": host_gpus(hardware)},
        num_client_hosts=backend.num_hosts,
        # which clients share a host: a batched run's bits depend on it (host_layout.py)
        host_layout=layout_record(backend.client_hosts, trains_batched(scenario.runtime)),
        client_host_actors=backend.host_names(),
        client_host_nodes=backend.host_nodes(),
        # per host: device, runtime.precision as resolved there (auto -> bf16/fp32), torch threads
        client_host_hardware=hardware,
        # whether a round's clients on a host train as one batched model, and why not (batching_record.py)
        batching=batching,
        encoder_parameters=int(backend.call("encoder_size")),
    )
    if observer is not None:
        observer.on_start(scenario, run_dir, backend.num_hosts)

    writer = TableWriter(run_dir)
    rows = RoundRowBuilder(client_hosts=backend.client_hosts, true_groups=prepared.partition.true_groups())
    round_row: dict[str, Any] = {}
    refresh_row: dict[str, Any] | None = None
    last_refresh: dict[str, Any] | None = None
    first_round = 1
    if checkpoint is not None:
        first_round, started = _resume_from_checkpoint(run_dir, checkpoint, backend, rows, started)
        writer.adopt_parts(first_round - 1, checkpoint.found.document.get("tables") if checkpoint.found is not None else {})
        if observer is not None and hasattr(observer, "skip_rounds"):
            observer.skip_rounds(first_round - 1)
    every = scenario.checkpoint.every
    rounds_run = first_round - 1
    stopped_early: str | None = None
    for round_index in range(first_round, scenario.protocol.rounds + 1):
        raise_if_received()  # a stop signal whose exception something swallowed
        round_started = time.perf_counter()
        report = backend.call("run_round", round_index)
        client_rows = rows.client_rows(report)
        refresh_row = rows.refresh_row(report, client_rows)
        round_row = rows.round_row(
            report, client_rows, wall_time_s=time.perf_counter() - round_started, elapsed_s=time.perf_counter() - started
        )
        writer.write_part("clients", round_index, client_rows)
        writer.write_part("updates", round_index, rows.update_rows(report, rows.client_hosts))
        writer.write_part("events", round_index, rows.event_rows(report))
        writer.write_part("newcomers", round_index, rows.newcomer_rows(report))
        if refresh_row is not None:
            writer.write_part("refresh", round_index, [refresh_row])
            last_refresh = refresh_row
            if scenario.output.save_refresh_cache:
                save_refresh_cache(run_dir, round_index, backend.call("refresh_cache"))
        writer.write_part("rounds", round_index, [round_row])
        if every is not None and round_index % every == 0 and round_index < scenario.protocol.rounds:
            write_checkpoint(
                run_dir,
                {
                    "round": round_index,
                    "server": backend.call("snapshot"),
                    "rows": rows.progress(),
                    "elapsed_s": time.perf_counter() - started,
                },
                fetch=backend.fetch,
                record={**scenario_record(prepared.as_written), **_auto_knobs_record(prepared), "tables": writer.parts_up_to(round_index)},
            )
        if observer is not None:
            observer.on_round(round_row, refresh_row, list(report.events))
        rounds_run = round_index
        if report.stop_reason is not None:  # the next round's release would pass privacy.max_epsilon
            stopped_early = report.stop_reason
            break
    update_manifest(run_dir, batching=batching_after_run(batching, run_dir))  # what the updates showed
    if prepared.privacy is not None:  # the epsilon spent (RDP, and PRV where it can), and where the run stopped
        from hdcfl_ray.runtime.privacy_plan import privacy_record, spent_record

        spent = spent_record(prepared.privacy, backend.call("privacy_releases"), rounds_run, stopped_early)
        update_manifest(run_dir, **{PRIVACY_RECORD: {**privacy_record(prepared.privacy), **spent}})
    return RunSummary(
        run_dir=run_dir,
        rounds=rounds_run,
        final_round=round_row,
        last_refresh=last_refresh,
        elapsed_s=time.perf_counter() - started,
        scored_on="validation" if scenario.partition.validation_fraction is not None else "test",
        stopped_early=stopped_early,
        curve=curve_rises(rounds_curve(read_table(run_dir, "rounds").to_pylist())),
    )


def _resume_from_checkpoint(
    run_dir: Path, search: CheckpointSearch, backend: LocalBackend | RayBackend, rows: RoundRowBuilder, started: float
) -> tuple[int, float]:
    """Restore the server and the row builder; returns (first round to run, clock start).
    Everything logged after the checkpoint's round goes, so the rounds that are redone
    are written once; this holds for the previous checkpoint as well as the newest."""
    if search.found is None:  # killed before the first checkpoint: start over, keeping nothing
        drop_parts_after(run_dir, 0)
        drop_refresh_caches_after(run_dir, 0)
        return 1, started
    checkpoint = search.found.payload(put=backend.put)
    backend.call("restore", checkpoint["server"])
    rows.restore(checkpoint["rows"])
    drop_parts_after(run_dir, checkpoint["round"])
    drop_refresh_caches_after(run_dir, checkpoint["round"])
    return checkpoint["round"] + 1, started - checkpoint["elapsed_s"]


def _arithmetic_facts(portable: bool) -> dict[str, Any]:
    from hdcfl_ray.portable.machine import arithmetic_facts
    from hdcfl_ray.portable.restart import replaced_values

    facts = arithmetic_facts(portable)
    if portable:  # the user's own values of the pinned variables, which the pins replaced
        facts["replaced"] = replaced_values()
    return facts


def _dataset_facts(prepared: PreparedRun) -> dict[str, Any]:
    dataset = prepared.dataset
    sizes = np.array([client.num_train for client in prepared.partition.clients])
    test_sizes = np.array([client.test_indices.shape[0] for client in prepared.partition.clients])
    quantiles = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
    natural: dict[str, Any] = {}
    if dataset.train_ids is not None:  # who made the samples: the ids each client holds
        held = [sorted({dataset.id_names[code] for code in np.unique(dataset.train_ids[client.train_indices])}) for client in prepared.partition.clients]
        natural = {
            "id_column": prepared.scenario.partition.partition_by,
            "ids_in_data": len(dataset.id_names),
            "ids_held": sum(len(names) for names in held),
            "client_ids": held,
        }
        if dataset.group_names:  # the planted groups the ids belong to (shakespeare_plays: the plays), by true_group code
            natural["group_names"] = list(dataset.group_names)
    return {
        "name": dataset.name,
        "samples": "character sequences" if dataset.text else "images",
        "train_samples": int(dataset.train_labels.shape[0]),  # after the pretraining pool is held out
        "pretrain_pool": prepared.scenario.dataset.pretrain_pool,
        "test_samples": int(dataset.test_labels.shape[0]),
        "num_classes": dataset.num_classes,
        "num_clients": len(prepared.partition.clients),  # what partition.num_clients: all stood for
        "image_shape": list(dataset.train_images.shape[1:]),
        "client_train_samples_min": int(sizes.min()),
        "client_train_samples_max": int(sizes.max()),
        "client_train_samples_quantiles": {f"{q:g}": float(np.quantile(sizes, q)) for q in quantiles},
        "client_test_samples_quantiles": {f"{q:g}": float(np.quantile(test_sizes, q)) for q in quantiles},
        **natural,
        "source_files": [{"path": path, "sha256": digest} for path, digest in dataset.source_files],
        "true_groups_known": prepared.partition.true_groups() is not None,
        # "validation": clients are scored on images held out of their own training data, never the test split
        "scored_on": "validation" if prepared.scenario.partition.validation_fraction is not None else "test",
    }

