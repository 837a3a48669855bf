"""The `hdcfl-ray` command line.

Exit codes: 0 success, 2 bad input (scenario, overrides, data files), 1 a failure
during the run.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any, List, Optional

import typer
from rich.console import Console
from rich.markup import escape

from hdcfl_ray.errors import RayStartFailed, ScenarioError
from hdcfl_ray.plain_text import plain_text

class _Command(typer.Typer):
    """The `hdcfl-ray` command (the console script calls it; tests invoke its commands)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except RayStartFailed as error:  # one line with what usually causes it, not Ray's traceback
            print(f"error: {plain_text(str(error))}", file=sys.stderr)
            raise SystemExit(1) from None
        except SystemExit as exit_request:
            from hdcfl_ray.runtime.interrupts import received

            if received() is None and "torch" not in sys.modules:
                raise
            # The command has finished: its tables and manifest are written and synced,
            # trackers closed, Ray shut down. What is left is the interpreter's
            # teardown, which costs 1-2 s once torch is loaded and, after a signal,
            # could trip over Ray's half-closed core worker (SIGSEGV) and turn exit
            # 130/143 into a crash; so the process ends here.
            code = exit_request.code
            if code is not None and not isinstance(code, int):
                print(code, file=sys.stderr)
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code if isinstance(code, int) else (0 if code is None else 1))


app = _Command(
    name="hdcfl-ray",
    help="Federated-learning simulator on Ray: HDC-FL and its baselines, with Arrow logs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
error_console = Console(stderr=True)

EXIT_BAD_INPUT = 2
EXIT_RUN_FAILED = 1

SetOption = typer.Option(
    None,
    "--set",
    help="Override a scenario key, e.g. --set protocol.rounds=5 (repeatable; the value is read as YAML).",
    metavar="KEY=VALUE",
)


def _fail_bad_input(error: ScenarioError) -> None:
    from hdcfl_ray.config.safe_yaml import clip

    # each line clipped: a message that quotes user input never echoes megabytes of it
    text = "\n".join(clip(line, 2000) for line in plain_text(str(error)).splitlines()[:200])
    # escaped: messages quote user text and fixes such as ".[dashboard]" that are not markup
    error_console.print(f"[bold red]error:[/] {escape(text)}", highlight=False, soft_wrap=True)
    raise typer.Exit(EXIT_BAD_INPUT)


def _pin_for_portable(scenarios: List[Any], what: str) -> None:
    """runtime.portable: the command computes with the portable pins, which the math
    libraries read when they load; started without them, the hdcfl-ray command
    restarts itself with them, before it loads data or computes anything
    (docs/same-results.md). Called in-process, the run refuses instead."""
    from hdcfl_ray.portable.restart import restart_pinned_if_needed, uniform_portable

    # only the hdcfl-ray command itself (the console script, python -m cli) restarts its
    # process: a test calling a command in-process must not restart pytest
    if getattr(sys.modules.get("__main__"), "app", None) is app:
        restart_pinned_if_needed(scenarios, what)
    else:
        uniform_portable(scenarios, what)


def _recorded_scenarios(run_dirs: List[Path]) -> List[Any]:
    """The scenarios finished runs recorded (a folder without a readable one is left to
    the command, which says what is wrong with it)."""
    from hdcfl_ray.config import load_scenario

    scenarios = []
    for run_dir in run_dirs:
        try:
            scenarios.append(load_scenario(run_dir / "scenario.yaml", []))
        except ScenarioError:
            continue
    return scenarios


def _print_notices(notices: tuple[str, ...]) -> None:
    """What a run does differently from what its scenario may suggest (a capped value)."""
    for notice in notices:
        error_console.print(f"[bold yellow]warning:[/] {escape(plain_text(notice))}", highlight=False, soft_wrap=True)


@app.callback()
def _load_named_plugins(
    plugins: Optional[List[str]] = typer.Option(
        None,
        "--plugin",
        help="Import this module as a plugin (methods, partitions, data sources, transforms, encoders it declares) "
        "before the command runs; repeatable. Installed plugin packages load without it.",
        metavar="MODULE",
    ),
) -> None:
    """Federated-learning simulator on Ray: HDC-FL and its baselines, with Arrow logs."""
    if plugins:
        from hdcfl_ray.plugins import load_plugins

        try:
            load_plugins(plugins)
        except ScenarioError as error:
            _fail_bad_input(error)


@app.command("plugins")
def list_plugins() -> None:
    """List the methods, partitions, data sources, transforms and encoders there are
    (built-in and from plugins, with each plugin's package and version) and each one's keys."""
    from hdcfl_ray.plugin_listing import describe

    try:
        print(describe())
    except (ScenarioError, ImportError, TypeError, ValueError) as error:
        _fail_bad_input(ScenarioError(f"plugins: {error}"))


@app.command()
def validate(
    scenario_file: Path = typer.Argument(..., help="Scenario YAML file."),
    overrides: Optional[List[str]] = SetOption,
) -> None:
    """Check a scenario (schema, data files, partition against the data) without running it."""
    from hdcfl_ray.config import load_scenario
    from hdcfl_ray.runtime.driver import prepare_run

    try:
        scenario = load_scenario(scenario_file, overrides or [])
        prepared = prepare_run(scenario)
    except ScenarioError as error:
        _fail_bad_input(error)
    _print_notices(prepared.notices)
    dataset = prepared.dataset
    scenario = prepared.scenario  # num_clients: all counted on the data
    print(
        f"{scenario_file}: valid. {scenario.algorithm.name} on {dataset.name} "
        f"({dataset.train_labels.shape[0]} train / {dataset.test_labels.shape[0]} test {dataset.sample_noun}, {dataset.num_classes} classes), "
        f"{scenario.partition.num_clients} clients ({scenario.partition.kind}), {scenario.protocol.rounds} rounds."
    )
    if dataset.has_ids:  # a natural partition: how the ids and samples fall over the clients
        sizes = sorted(client.num_train for client in prepared.partition.clients)
        print(
            f"  ids ({scenario.partition.partition_by}): {len(dataset.id_names)} in the data, "
            f"{scenario.partition.num_clients * scenario.partition.ids_per_client} held by the clients; training "
            f"{dataset.sample_noun} per client: min {sizes[0]}, median {sizes[len(sizes) // 2]}, max {sizes[-1]}"
        )
    from hdcfl_ray.config.pinned_knobs import data_setting_fingerprint

    # what `chosen_for` holds for a knob value chosen on this setting
    print(f"  data setting (dataset, partition, model): {data_setting_fingerprint(scenario)}")
    if prepared.auto_plan is not None:  # what choosing the auto knobs will run (nothing runs here)
        from hdcfl_ray.auto_knobs.cache import cached_choice, not_used_notice
        from hdcfl_ray.auto_knobs.digests import data_digest

        entry, cached, problem = cached_choice(scenario, prepared.auto_plan, data=data_digest(dataset, prepared.partition))
        for line in prepared.auto_plan.describe():
            print(f"  {line}")
        if problem is not None:
            _print_notices((not_used_notice(entry, problem),))
        if cached is not None:
            print(f"  chosen before for this setting, data, code and seed: {', '.join(f'{knob.key} = {knob.chosen:g}' for knob in cached.knobs)} ({entry})")
        else:
            print(f"  {prepared.auto_plan.candidate_runs} candidate run(s) before the run, kept in {entry}")


@app.command()
def simulate(
    scenario_file: Optional[Path] = typer.Argument(None, help="Scenario YAML file (omit with --resume)."),
    overrides: Optional[List[str]] = SetOption,
    out: Optional[Path] = typer.Option(None, "--out", help="Run directory (default: <output.dir>/<name>-<algorithm>-seed<seed>-<time>)."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Continue the killed run in this run directory from its last checkpoint."),
    allow_layout_change: bool = typer.Option(
        False,
        "--allow-layout-change",
        help="With --resume: let a batched run go on with its clients on other hosts (other batches, other bits); "
        "the manifest records the change and reports mark the run.",
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No live view or summary; print only the run directory."),
) -> None:
    """Run one simulation and write its run directory (scenario, manifest, Parquet tables).
    SIGINT (Ctrl-C) or SIGTERM stops it resumably: exit 130 or 143, the manifest marked
    interrupted, and the resume command printed."""
    from hdcfl_ray.runtime.interrupts import stop_signals

    seen: dict[str, Any] = {}
    with stop_signals():  # from here on, a stop signal unwinds the run instead of killing it
        try:
            _simulate(scenario_file, overrides, out, resume, quiet, seen, allow_layout_change)
        except KeyboardInterrupt as interrupt:
            _stopped_by_signal(interrupt, seen)


def _stopped_by_signal(interrupt: KeyboardInterrupt, seen: dict[str, Any]) -> None:
    """One line naming the run folder and the resume command (only when the folder
    holds a run to resume), then exit 128 + the signal number."""
    import signal

    from hdcfl_ray.terminal.live_view import LiveView

    observer = seen.get("observer")
    if isinstance(observer, LiveView):
        observer.abort()
    from hdcfl_ray.runtime.interrupts import received

    # the signal as noted when it came (Ray re-raises a KeyboardInterrupt of its own from ray.get)
    signum = received() or getattr(interrupt, "signum", signal.SIGINT)
    name = signal.Signals(signum).name
    run_dir: Path | None = seen.get("run_dir")
    if run_dir is not None and (run_dir / "scenario.yaml").is_file():
        shown = escape(plain_text(str(run_dir)))
        error_console.print(
            f"interrupted ({name}); finished rounds are in {shown}; continue with: hdcfl-ray simulate --resume {shown}",
            highlight=False,
            soft_wrap=True,
        )
    else:
        error_console.print(f"interrupted ({name}) before the run folder was made; nothing was written", highlight=False)
    raise typer.Exit(128 + signum)


def _simulate(
    scenario_file: Optional[Path],
    overrides: Optional[List[str]],
    out: Optional[Path],
    resume: Optional[Path],
    quiet: bool,
    seen: dict[str, Any],
    allow_layout_change: bool = False,
) -> None:
    from hdcfl_ray.config import load_scenario
    from hdcfl_ray.runtime.driver import check_run_dir_free, default_run_dir, prepare_run, resumable_run, run_simulation
    from hdcfl_ray.terminal.live_view import LiveView, QuietObserver

    try:
        if resume is not None:
            if scenario_file is not None or out is not None:
                raise ScenarioError("--resume RUN_DIR takes neither a scenario file nor --out: the run directory holds both")
            # refuses --set keys and edits of scenario.yaml that would change the results
            scenario = resumable_run(resume, list(overrides or []))
        elif allow_layout_change:
            raise ScenarioError("--allow-layout-change goes with --resume RUN_DIR: a new run has no layout to change")
        elif scenario_file is None:
            raise ScenarioError("give a scenario file (hdcfl-ray simulate SCENARIO) or --resume RUN_DIR")
        else:
            scenario = load_scenario(scenario_file, overrides or [])
        _pin_for_portable([scenario], "the run")
        run_dir = resume or out or default_run_dir(scenario)
        seen["run_dir"] = run_dir
        if resume is None:
            check_run_dir_free(run_dir)
        prepared = prepare_run(scenario)
    except ScenarioError as error:
        _fail_bad_input(error)
    _print_notices(prepared.notices)
    observer = QuietObserver() if quiet else LiveView()
    seen["observer"] = observer
    if not quiet:
        dataset = prepared.dataset
        Console().print(
            f"[dim]{dataset.name}: {dataset.train_labels.shape[0]} train / {dataset.test_labels.shape[0]} test "
            f"{dataset.sample_noun}; "
            f"starting the client hosts ...[/]",
            highlight=False,
        )
    try:
        summary = run_simulation(prepared, run_dir, observer, resume=resume is not None, allow_layout_change=allow_layout_change)
    except ScenarioError as error:
        if isinstance(observer, LiveView):
            observer.abort()
        _fail_bad_input(error)
    except Exception as error:  # a failure during the run: say what and where the partial logs are
        if isinstance(observer, LiveView):
            observer.abort()
        _print_run_failure(error)
        shown = escape(plain_text(str(run_dir)))
        if (run_dir / "scenario.yaml").is_file():
            error_console.print(f"finished rounds are in {shown}; continue with: hdcfl-ray simulate --resume {shown}", highlight=False, soft_wrap=True)
        else:  # it failed before the run directory was made (starting or joining Ray)
            error_console.print(f"nothing was written to {shown}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_RUN_FAILED)
    if quiet:
        print(summary.run_dir)


def _print_run_failure(error: Exception) -> None:
    """What failed, in the first line (a failing client named with its round, on
    either backend), then where it happened: the client's traceback, which on Ray
    would otherwise come first and bury that line at its end."""
    from hdcfl_ray.errors import failure_text, failure_traceback

    error_console.print(f"[bold red]run failed:[/] {escape(failure_text(error))}", highlight=False, soft_wrap=True)
    where = failure_traceback(error)
    if where:
        error_console.print(where, style="dim", highlight=False, markup=False, soft_wrap=True)


@app.command()
def pretrain(
    scenario_file: Path = typer.Argument(..., help="Scenario whose dataset.pretrain_pool, model and optimizer to pretrain with."),
    out: Path = typer.Option(..., "--out", help="Weights file to write (e.g. weights/c10-pool.pt); model.pretrained loads it."),
    epochs: int = typer.Option(10, "--epochs", help="Passes over the pool."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Default: protocol.batch_size."),
    lr: Optional[float] = typer.Option(None, "--lr", help="Default: protocol.optimizer.lr."),
    transform: str = typer.Option("none", "--transform", help="none: the pool as stored; scenario: each image at one of the partition's rotation angles."),
    overrides: Optional[List[str]] = SetOption,
) -> None:
    """Train an encoder and head centrally on the pretraining pool (training images no client holds) and save them."""
    from hdcfl_ray.config import load_scenario
    from hdcfl_ray.pretraining import EpochReport
    from hdcfl_ray.pretraining import pretrain as run_pretraining

    if transform not in ("none", "scenario"):
        _fail_bad_input(ScenarioError(f"--transform: {transform!r}; use none or scenario"))

    def show(report: EpochReport) -> None:
        print(f"epoch {report.epoch}/{epochs}: train loss {report.train_loss:.4f}, test accuracy {100 * report.test_accuracy:.2f}%", flush=True)

    try:
        from hdcfl_ray.config.paths import check_writable

        scenario = load_scenario(scenario_file, overrides or [])
        if epochs < 1:
            raise ScenarioError(f"--epochs {epochs}: give at least 1")
        check_writable(out, "--out", "file")  # before training, not after every epoch has run
        _pin_for_portable([scenario], "pretraining")  # runtime.portable: the same weights on every machine
        summary = run_pretraining(scenario, out, epochs=epochs, batch_size=batch_size, lr=lr, transform=transform, progress=show)  # type: ignore[arg-type]
    except ScenarioError as error:
        _fail_bad_input(error)
    print(
        f"wrote {summary.path}: {summary.pool_images} pool images, {len(summary.epochs)} epochs in {summary.seconds:.0f} s. "
        f"Use it with --set model.pretrained={summary.path} and the same dataset.pretrain_pool."
    )


@app.command()
def sweep(
    files: List[Path] = typer.Argument(..., help="Scenario files, or one sweep file (scenarios:, algorithms:, seeds:, set:)."),
    algorithms: Optional[str] = typer.Option(None, "--algorithms", help="Comma-separated methods, e.g. fedavg_se,hdcfl,ifca, or all (default: each scenario's own)."),
    seeds: Optional[str] = typer.Option(None, "--seeds", help="Comma-separated seeds, e.g. 42,123,2026 (default: each scenario's own)."),
    overrides: Optional[List[str]] = SetOption,
    out: Optional[Path] = typer.Option(None, "--out", help="Sweep folder: one run directory per setting/method/seed, and index.json."),
    parallel: Optional[int] = typer.Option(None, "--parallel", help="Runs at once (default: one per two actor slots of the cluster)."),
    report_file: Optional[Path] = typer.Option(None, "--report", help="When the sweep is done, write its report (Markdown tables) to this file."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the sweep folder."),
    replace_changed: bool = typer.Option(
        False, "--replace-changed", help="Start afresh the runs on disk made with other settings (their folders are moved to SWEEP_DIR.replaced-<time>/)."
    ),
) -> None:
    """Run a grid of scenarios x methods x seeds; completed runs are skipped, killed ones resumed
    (a run on disk made with other settings stops the sweep, exit 2, unless --replace-changed)."""
    from hdcfl_ray.api import sweep_plan
    from hdcfl_ray.sweeps.grid import check_seeds, parse_list

    try:  # the grid read as hdcfl_ray.sweep reads it (one implementation)
        seed_values = check_seeds(parse_list(seeds, "--seeds"), "--seeds") if seeds is not None else None
        algorithm_names = parse_list(algorithms, "--algorithms") or None
        plan, runs = sweep_plan(list(files), algorithm_names, seed_values, tuple(overrides or ()), out)
        if report_file is not None:
            from hdcfl_ray.config.paths import check_writable

            check_writable(report_file, "--report", "file")
        _pin_for_portable([run.scenario for run in runs], "the sweep")
    except ScenarioError as error:
        _fail_bad_input(error)
    console = Console(quiet=quiet)
    console.print(f"sweep: {len(runs)} runs into {plan.out}")

    from hdcfl_ray.sweeps.runner import ClusterLostError

    try:
        outcome = _run_sweep_stoppably(runs, plan.out, parallel, console, replace_changed, "sweep")
    except ScenarioError as error:  # runs on disk made with other settings, a damaged manifest
        _fail_bad_input(error)
    except ClusterLostError as error:
        console.print(f"error: {escape(plain_text(str(error)))}", highlight=False)
        raise typer.Exit(1) from None
    console.print(
        f"{len(outcome.completed)} run(s) completed, {len(outcome.skipped)} already complete, {len(outcome.failed)} failed; "
        f"index: {plan.out / 'index.json'}; report: hdcfl-ray report {plan.out}"
    )
    if report_file is not None:
        from hdcfl_ray.api import render_report, report_tables

        try:  # the report as `hdcfl-ray report SWEEP_DIR --format md` writes it
            tables, _ = report_tables([plan.out], None, None, lambda text: console.print(text, highlight=False, markup=False))
        except ScenarioError as error:  # e.g. two runs of one seed: the sweep's runs stay, the report is not written
            _fail_bad_input(error)
        report_file.parent.mkdir(parents=True, exist_ok=True)
        report_file.write_text(render_report(tables, "md"))
        console.print(f"report written to {report_file}")
    if quiet:
        print(plan.out)
    if outcome.failed:
        raise typer.Exit(EXIT_RUN_FAILED)


def _run_sweep_stoppably(
    runs: list[Any], out: Path, parallel: Optional[int], console: Console, replace_changed: bool, title: str
) -> Any:
    """run_sweep under stop_signals, shown live (hdcfl_ray/terminal/sweep_view.py: a table
    of every run's round, accuracy and ETA in a terminal, plain lines otherwise).
    SIGINT (Ctrl-C) or SIGTERM, once or twice, marks the runs in flight interrupted,
    stops the sweep's Ray with every process of it, prints one line with the command
    that continues the sweep (the same one), and exits 128 + the signal's number (130, 143)."""
    import shlex
    import signal

    from hdcfl_ray.runtime.interrupts import received, stop_signals
    from hdcfl_ray.sweeps.runner import run_sweep
    from hdcfl_ray.terminal.sweep_view import SweepView

    view = SweepView([(run.key, run.scenario.protocol.rounds) for run in runs], console, title)
    with stop_signals():
        try:
            with view:
                return run_sweep(
                    runs,
                    out,
                    runs[0].scenario.runtime,
                    parallel,
                    view.on_progress,
                    replace_changed=replace_changed,
                    observer_for=view.observer,
                )
        except KeyboardInterrupt as interrupt:
            signum = received() or getattr(interrupt, "signum", signal.SIGINT)
            command = shlex.join(["hdcfl-ray", *sys.argv[1:]])
            error_console.print(
                f"interrupted ({signal.Signals(signum).name}); finished runs are kept in {out}; continue with the same command: {command}",
                highlight=False,
                soft_wrap=True,
            )
            raise typer.Exit(128 + signum) from None


@app.command()
def calibrate(
    scenario_file: Path = typer.Argument(..., help="The scenario (setting) to calibrate the knob on."),
    key: str = typer.Option(..., "--key", help="The knob, a dotted scenario key, e.g. algorithm.pacfl.threshold."),
    values: str = typer.Option(..., "--values", help="Comma-separated values to try, e.g. 1.5,2.5,4."),
    algorithm: Optional[str] = typer.Option(None, "--algorithm", help="The method to run (default: the scenario's own)."),
    seeds: Optional[str] = typer.Option(None, "--seeds", help="Comma-separated seeds (default: the scenario's own)."),
    overrides: Optional[List[str]] = SetOption,
    out: Path = typer.Option(..., "--out", help="Sweep folder for the calibration runs (rerun to resume)."),
    report_file: Optional[Path] = typer.Option(None, "--report", help="Write the calibration table (Markdown) to this file."),
    parallel: Optional[int] = typer.Option(None, "--parallel", help="Runs at once (default: as for sweep)."),
    validation_fraction: float = typer.Option(
        0.2, "--validation-fraction", help="Share of each client's training samples held out and scored to choose the value."
    ),
    oracle: bool = typer.Option(
        False, "--oracle", help="Score on the test set instead (labelled oracle; the table then chooses no value)."
    ),
    replace_changed: bool = typer.Option(
        False, "--replace-changed", help="Start afresh the runs on disk made with other settings (their folders are moved to OUT.replaced-<time>/)."
    ),
) -> None:
    """Run one knob over a list of values on one setting and choose the value with the
    best mean accuracy on images held out of each client's training data (never the
    test set); the table also shows the groups found, their ARI against the planted
    groups (oracle evidence, not used to choose) and the budget."""
    from hdcfl_ray.sweeps.calibration import calibration_runs
    from hdcfl_ray.sweeps.grid import check_seeds, parse_list
    from hdcfl_ray.sweeps.runner import ClusterLostError

    try:
        if not scenario_file.is_file():
            raise ScenarioError(f"{scenario_file}: no such file")
        seed_values = check_seeds(parse_list(seeds, "--seeds"), "--seeds") if seeds is not None else None
        if report_file is not None:
            from hdcfl_ray.config.paths import check_writable

            check_writable(report_file, "--report", "file")
        value_list = parse_list(values, "--values") or ()
        runs = calibration_runs(
            scenario_file, key, value_list, algorithm, seed_values, tuple(overrides or ()), out, None if oracle else validation_fraction
        )
        _pin_for_portable([run.scenario for run in runs], "the calibration")
    except ScenarioError as error:
        _fail_bad_input(error)
    console = Console()
    scored = "the test set (oracle)" if oracle else f"{validation_fraction:g} of each client's training images, held out"
    console.print(f"calibrate {key}: {len(runs)} runs ({len(value_list)} values) into {out}, scored on {scored}")
    try:
        outcome = _run_sweep_stoppably(runs, out, parallel, console, replace_changed, f"calibrate {key}")
    except ScenarioError as error:  # runs on disk made with other settings, a damaged manifest
        _fail_bad_input(error)
    except ClusterLostError as error:
        console.print(f"error: {escape(plain_text(str(error)))}", highlight=False)
        raise typer.Exit(EXIT_RUN_FAILED) from None
    from analysis.calibration_table import calibration_table
    from analysis.report_tables import to_markdown, to_rich
    from analysis.runs import load_runs

    try:
        table = calibration_table(load_runs([run.run_dir for run in runs if run.run_dir.exists()]), key)
    except ScenarioError as error:  # its runs differ in more than the knob, or repeat a value and seed
        _fail_bad_input(error)
    for rendered in to_rich([table]):
        console.print(rendered)
    if report_file is not None:
        report_file.parent.mkdir(parents=True, exist_ok=True)
        report_file.write_text(to_markdown([table]))
        console.print(f"calibration table written to {report_file}")
    if outcome.failed:
        raise typer.Exit(EXIT_RUN_FAILED)


@app.command()
def report(
    paths: List[Path] = typer.Argument(..., help="Run directories, sweep folders, or folders that hold run directories."),
    output_format: str = typer.Option("table", "--format", help="table (terminal), md, csv or latex."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the report to this file instead of the terminal."),
    figures: Optional[Path] = typer.Option(None, "--figures", help="Also write PNG figures (learning curves, grouping diagnostics, client distributions, memberships, accuracy against communication, accuracy and ARI against epsilon where private runs of a setting hold two or more privacy levels) to this folder."),
    against: Optional[str] = typer.Option(None, "--against", help="The method (or output.label) the paired table takes each other method from, seed by seed (default: hdcfl)."),
    keep_duplicate: Optional[str] = typer.Option(
        None,
        "--keep-duplicate",
        help="Of two runs of the same method, setting and seed (refused without this), keep the newest or the oldest (by start time).",
        metavar="newest|oldest",
    ),
) -> None:
    """The paper's tables from finished runs: mean ± sample std over seeds, best and second
    best, average rank, tail tables, macro averages with tail rank, ARI for clustered methods.
    Runs are averaged only where their resolved scenarios agree in all but the seed and the
    keys a rerun may change; other runs of a scenario name get columns of their own."""
    from hdcfl_ray.api import render_report, report_tables

    if output_format not in ("md", "markdown", "csv", "latex", "table"):
        _fail_bad_input(ScenarioError(f"--format {output_format!r}: choose table, md, csv or latex"))
    from hdcfl_ray.config.paths import check_writable

    def notice(text: str) -> None:
        Console(stderr=True).print(text, highlight=False, markup=False)

    try:  # outputs and inputs checked before anything is computed; the tables: hdcfl_ray.api's one implementation
        if out is not None:
            check_writable(out, "--out", "file")
        if figures is not None:
            check_writable(figures, "--figures", "folder")
        tables, placed = report_tables(list(paths), against, keep_duplicate, notice)
    except ScenarioError as error:
        _fail_bad_input(error)
    if figures is not None:
        from analysis.figures import write_figures

        written = write_figures(placed, figures)
        Console(stderr=True).print(f"wrote {len(written)} figure(s) to {figures}")
    if output_format == "table" and out is None:
        from analysis.report_tables import to_rich

        console = Console()
        for table in to_rich(tables):
            console.print(table)
        return
    text = render_report(tables, "md" if output_format == "table" else output_format)
    if out is None:
        print(text, end="")
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"wrote {out}")


@app.command()
def ablate(
    run_dir: Path = typer.Argument(..., help="A finished HDC-FL run made with --set output.save_refresh_cache=true."),
    overrides: Optional[List[str]] = SetOption,
    out: Path = typer.Option(..., "--out", help="Folder for the replay's clients/rounds/refresh tables (like a run)."),
) -> None:
    """Replay HDC-FL's refreshes of a finished run with other server-side settings
    (algorithm.hdcfl.*: descriptor, rank, groups, membership, temperature, mix, prototypes).
    A knob the run chose itself (`auto`) keeps the value it chose, unless --set gives another."""
    from hdcfl_ray.ablation import ablate_run

    try:
        _pin_for_portable(_recorded_scenarios([run_dir]), "the replay")
        written = ablate_run(run_dir, list(overrides or []), out)
    except ScenarioError as error:
        _fail_bad_input(error)
    print(f"wrote {written}; compare with: hdcfl-ray report {run_dir} {written}")


diagnose_app = typer.Typer(help="Diagnostics computed from a finished run.", no_args_is_help=True)
app.add_typer(diagnose_app, name="diagnose")


@diagnose_app.command("donor-swap")
def donor_swap(
    run_dirs: List[Path] = typer.Argument(
        ..., help="Finished HDC-FL runs made with --set output.save_refresh_cache=true; several (e.g. one setting's seeds) are averaged over every target and run."
    ),
    out: Optional[Path] = typer.Option(None, "--out", help="Folder for donor_swap.parquet (one row per target/donor pair; one subfolder per run when several)."),
    max_test_samples: int = typer.Option(256, "--max-test-samples", min=1, help="Test images per target (the first N)."),
    report_file: Optional[Path] = typer.Option(None, "--report", help="Also write the tables (Markdown, with the runs and what made them) to this file."),
) -> None:
    """Pair each target's head with every donor's cached encoder: Spearman rho, AUROC, AP,
    beneficial rate, AP lift, top-1 minus random, gains by head-distance quintile (tables 4, 14, 15)."""
    from analysis.provenance import provenance_note, run_provenance
    from hdcfl_ray.config.paths import check_writable
    from hdcfl_ray.ablation.donor_swap_run import donor_swap_runs, format_summary
    from hdcfl_ray.durable_files import write_text_durably
    from hdcfl_ray.logs.manifest import read_manifest

    try:
        if report_file is not None:
            check_writable(report_file, "--report", "file")
        _pin_for_portable(_recorded_scenarios(run_dirs), "the diagnostic")
        summary = donor_swap_runs(list(run_dirs), out, max_test_samples=max_test_samples)
    except ScenarioError as error:
        _fail_bad_input(error)
    text = format_summary(summary)
    print(text)
    if out is not None:
        print(f"pairs written under {out}")
    if report_file is not None:
        manifests = []
        for run_dir in run_dirs:
            try:
                manifests.append(read_manifest(run_dir) or {})
            except ScenarioError:  # a damaged manifest leaves its run's provenance unrecorded
                manifests.append({})
        listed = ", ".join(f"`{run_dir}`" for run_dir in run_dirs)
        source = provenance_note(run_provenance(manifest) for manifest in manifests)
        write_text_durably(report_file, f"{text}\n\nRuns: {listed}; {max_test_samples} test images per target. {source}\n")
        print(f"report written to {report_file}")


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
