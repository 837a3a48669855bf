"""The Python API: run a scenario, load a finished run, run a sweep, write a report.

    import hdcfl_ray
    run = hdcfl_ray.simulate("scenarios/quickstart.yaml", overrides={"protocol.rounds": 5})
    run.final["mean_accuracy"], run.rounds.to_pandas()

Every function takes the same inputs as the command line and runs the same code:
a scenario and seed give the same per-client accuracies either way. Bad input
raises `ScenarioError` with the message the CLI prints; nothing here exits the
interpreter. Everything heavy (torch, Ray, pyarrow) is imported inside the
functions, so `import hdcfl_ray` stays fast.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence, Union

from hdcfl_ray.logs.summary_columns import ACCURACY_SUMMARY_COLUMNS
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.plain_text import plain_text

if TYPE_CHECKING:
    import pyarrow as pa

    from hdcfl_ray.config.schema import Scenario
    from hdcfl_ray.diagnostics.curve_trend import CurveRises

PathLike = Union[str, Path]
ScenarioInput = Union[PathLike, Mapping[str, Any], "Scenario"]

# the metrics of a run's final evaluated round that `Run.final` holds (rounds.parquet columns)
FINAL_METRICS = ("round", *ACCURACY_SUMMARY_COLUMNS, "personalized", "num_groups", "ari_true")
REPORT_FORMATS = ("md", "markdown", "csv", "latex", "table")


class Run:
    """A run directory: its resolved scenario, manifest and Parquet tables.

    Tables are `pyarrow.Table`s read on first use (`run.rounds.to_pandas()` works
    when pandas is installed). Accuracies are fractions in [0, 1]."""

    def __init__(self, run_dir: PathLike, notices: Sequence[str] = ()) -> None:
        self.dir = Path(run_dir)
        # what the run did differently from what its scenario may suggest (a capped value)
        self.notices: tuple[str, ...] = tuple(notices)

    def __repr__(self) -> str:
        return f"Run({str(self.dir)!r}, status={self.status!r})"

    @cached_property
    def scenario(self) -> dict[str, Any]:
        """The resolved scenario (scenario.yaml: every default and override applied)."""
        from hdcfl_ray.config.loading import read_scenario_file

        return read_scenario_file(self.dir / "scenario.yaml")

    @property
    def manifest(self) -> dict[str, Any]:
        """manifest.json: status, seed, package versions, hardware, dataset facts."""
        import json

        path = self.dir / "manifest.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    @property
    def status(self) -> str:
        return str(self.manifest.get("status", "unknown"))

    def table(self, name: str) -> "pa.Table":
        """One of the run's tables: clients, rounds, refresh, updates, events, newcomers (docs/logs.md)."""
        from hdcfl_ray.logs.schemas import TABLE_SCHEMAS
        from hdcfl_ray.logs.table_writer import read_table

        if name not in TABLE_SCHEMAS:
            raise ScenarioError(f"table {name!r}: a run has the tables {', '.join(TABLE_SCHEMAS)}")
        return read_table(self.dir, name)

    @cached_property
    def rounds(self) -> "pa.Table":
        """One row per round (rounds.parquet)."""
        return self.table("rounds")

    @cached_property
    def clients(self) -> "pa.Table":
        """One row per client per evaluated round (clients.parquet)."""
        return self.table("clients")

    @cached_property
    def refresh(self) -> "pa.Table":
        """HDC-FL's refreshes (refresh.parquet); empty for other methods."""
        return self.table("refresh")

    @property
    def final(self) -> dict[str, Any]:
        """The last evaluated round's metrics: mean_accuracy, worst_accuracy,
        bottom20_accuracy, gap, the global and local references, num_groups,
        ari_true (None where the run logs none, or when no round was evaluated)."""
        evaluated = [row for row in self.rounds.to_pylist() if row["evaluated"]]
        last = max(evaluated, key=lambda row: row["round"]) if evaluated else {}
        return {key: last.get(key) for key in FINAL_METRICS}

    @property
    def curve(self) -> "CurveRises":
        """How the mean accuracy moved: `late` (the rise fitted over the last third of the
        rounds), `total` (since the first evaluated round) and `late_error`, fractions; NaN
        for fewer than three evaluated rounds (hdcfl_ray/diagnostics/curve_trend.py)."""
        from hdcfl_ray.diagnostics.curve_trend import curve_rises, rounds_curve

        return curve_rises(rounds_curve(self.rounds.to_pylist()))

    @property
    def still_rising(self) -> bool:
        """True when the mean accuracy was still climbing as the run stopped, by the rule the
        reports flag rows with ("still rising"): its final numbers are not where it converges."""
        return self.curve.rising

    @property
    def falling(self) -> bool:
        """True when the mean accuracy was going down as the run stopped, by the rule the
        reports flag rows with ("falling"): its final numbers are below what it reached earlier."""
        return self.curve.falling


def simulate(
    scenario: ScenarioInput,
    *,
    overrides: Mapping[str, Any] | None = None,
    out: PathLike | None = None,
    progress: bool = True,
    plugins: Sequence[str] = (),
) -> Run:
    """Run one simulation, as `hdcfl-ray simulate`, and return its run directory.

    scenario: a YAML file, or a mapping with the file's content.
    overrides: {"protocol.rounds": 5, ...}: each key set as `--set KEY=VALUE` sets it
      (dotted path, sections created as needed); values are Python values.
    out: the run directory (default <output.dir>/<name>-<algorithm>-seed<seed>-<time>);
      it must be new or empty.
    progress: the live view (round progress, accuracies) and the summary table, in a
      terminal or a notebook; False prints nothing.
    plugins: modules to import as plugins first, as `hdcfl-ray --plugin MODULE`
      (installed plugin packages load without it).
    Raises ScenarioError on bad input, before anything starts or is written.
    """
    from hdcfl_ray.runtime.driver import check_run_dir_free, default_run_dir, prepare_run, run_simulation

    load_plugins(plugins)
    resolved = resolve_scenario(scenario, overrides)
    run_dir = Path(out) if out is not None else default_run_dir(resolved)
    check_run_dir_free(run_dir)
    if _needs_pinned_process([resolved]):
        return _simulate_pinned(resolved, run_dir, progress, plugins)
    prepared = prepare_run(resolved)
    observer: Any
    if progress:
        from rich.console import Console
        from rich.markup import escape

        from hdcfl_ray.terminal.live_view import LiveView

        console = Console()
        for notice in prepared.notices:
            console.print(f"[bold yellow]warning:[/] {escape(notice)}", highlight=False, soft_wrap=True)
        observer = LiveView(console)
    else:
        observer = _silent_observer()
    try:
        run_simulation(prepared, run_dir, observer)
    except BaseException:
        if progress:
            observer.abort()
        raise
    return Run(run_dir, prepared.notices + tuple(getattr(observer, "notices", ())))


def _needs_pinned_process(scenarios: Iterable["Scenario"]) -> bool:
    """Whether these runs ask for portable arithmetic that this process cannot give:
    its math libraries fixed their instruction sets when they loaded, so the runs go to
    a fresh process started with the portable environment (portable/child.py). Raises
    ScenarioError for runs that mix the modes, or a CPU that cannot run portably."""
    from hdcfl_ray.portable.process import machine_problem, unpinned_libraries
    from hdcfl_ray.portable.restart import uniform_portable

    if not uniform_portable(scenarios, "the call"):
        return False
    problem = machine_problem()
    if problem is not None:
        raise ScenarioError(problem)
    return bool(unpinned_libraries())


def _plugin_arguments(plugins: Sequence[str]) -> list[str]:
    from hdcfl_ray.plugins import named_modules

    return [argument for module in dict.fromkeys([*named_modules(), *plugins]) for argument in ("--plugin", module)]


def _simulate_pinned(resolved: "Scenario", run_dir: Path, progress: bool, plugins: Sequence[str]) -> Run:
    """The portable run in a fresh pinned process (`hdcfl-ray simulate`), read back here."""
    import tempfile

    from hdcfl_ray.config.loading import scenario_to_yaml
    from hdcfl_ray.portable.child import run_command_pinned

    printer = _printer(progress)
    printer("runtime.portable: this Python was not started with the portable environment; the run goes to a fresh pinned process")
    with tempfile.TemporaryDirectory(prefix="hdcfl-ray-portable-") as folder:
        path = Path(folder) / "scenario.yaml"
        path.write_text(scenario_to_yaml(resolved), encoding="utf-8")
        arguments = [*_plugin_arguments(plugins), "simulate", str(path), "--out", str(run_dir), *([] if progress else ["--quiet"])]
        run_command_pinned(arguments, print if progress else None)
    return Run(run_dir)


def load_plugins(modules: Iterable[str]) -> None:
    """Import `modules` as plugins (their methods, partitions, data sources, transforms
    and encoders join the built-in ones), as `hdcfl-ray --plugin MODULE` does."""
    from hdcfl_ray.plugins import load_plugins as load

    load(list(modules))


def resolve_scenario(scenario: ScenarioInput, overrides: Mapping[str, Any] | None = None) -> "Scenario":
    """The validated scenario of a file or mapping with `overrides` applied, exactly as
    the CLI resolves a file and its `--set` options."""
    from hdcfl_ray.config.loading import apply_overrides, build_scenario, expand_env, read_scenario_file
    from hdcfl_ray.config.schema import Scenario

    override_texts = _override_texts(overrides)
    if isinstance(scenario, Scenario):
        raw: dict[str, Any] = scenario.model_dump(mode="json")
        source = "scenario"
    elif isinstance(scenario, Mapping):
        raw = dict(scenario)
        source = "scenario"
    elif isinstance(scenario, (str, Path)):
        raw = read_scenario_file(scenario)
        source = str(scenario)
    else:
        raise ScenarioError(
            f"scenario: {type(scenario).__name__} given; pass a YAML file path or a mapping of scenario keys"
        )
    return build_scenario(expand_env(apply_overrides(raw, override_texts)), source=source)


def _override_texts(overrides: Mapping[str, Any] | None) -> list[str]:
    """{"protocol.rounds": 5} -> ["protocol.rounds=5"]: the `--set` form, so a key means
    what it means on the command line; each value is written as YAML and read back
    unchanged (a string stays a string)."""
    import yaml

    if overrides is None:
        return []
    if not isinstance(overrides, Mapping):
        raise ScenarioError(
            f"overrides: {type(overrides).__name__} given; pass a mapping such as {{'protocol.rounds': 5}}"
        )
    texts = []
    for key, value in overrides.items():
        if not isinstance(key, str):
            raise ScenarioError(f"overrides: key {key!r} is not a dotted key path such as protocol.rounds")
        try:
            value_text = yaml.safe_dump(_plain(value), default_flow_style=True, width=float("inf"))
        except yaml.YAMLError as exc:
            raise ScenarioError(f"overrides: {key}: {type(value).__name__} is not a scenario value ({exc})") from None
        texts.append(f"{key}={value_text.strip().removesuffix('...').strip()}")
    return texts


def _plain(value: Any) -> Any:
    """Tuples as lists, numpy scalars and paths as the plain values YAML writes."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and callable(value.item) and type(value).__module__ == "numpy":
        return value.item()
    return value


def load_run(path: PathLike) -> Run:
    """A run directory written by `simulate` (finished, or stopped part way)."""
    run_dir = Path(path)
    if not (run_dir / "scenario.yaml").is_file():
        raise ScenarioError(f"{run_dir}: not a run directory (no scenario.yaml)")
    return Run(run_dir)


@dataclass
class SweepResult:
    """A finished sweep: its folder and one `Run` per run directory in it."""

    dir: Path
    runs: list[Run]
    completed: list[str] = field(default_factory=list)  # run keys <setting>/<algorithm>/seed<seed>
    skipped: list[str] = field(default_factory=list)  # complete before this call
    failed: dict[str, str] = field(default_factory=dict)  # run key -> error

    def report(self, format: str = "md") -> str:
        return report([self.dir], format=format)


def sweep(
    scenarios: PathLike | Sequence[PathLike],
    *,
    out: PathLike | None = None,
    algorithms: Sequence[str] | str | None = None,
    seeds: Sequence[int] | None = None,
    overrides: Mapping[str, Any] | None = None,
    parallel: int | None = None,
    replace_changed: bool = False,
    progress: bool = True,
) -> SweepResult:
    """Run a grid of scenarios x methods x seeds, as `hdcfl-ray sweep`.

    scenarios: scenario files, or one sweep file (scenarios:, algorithms:, seeds:, set:, out:).
    algorithms: method names or "all" (default: each scenario's own); seeds likewise.
    out: the sweep folder (required unless the sweep file names one). Completed runs
    are skipped and killed ones resumed; a run on disk made with other settings
    raises ScenarioError unless replace_changed. A run that fails does not stop the
    others: it is listed in `failed`.
    """
    from hdcfl_ray.sweeps.runner import ClusterLostError, run_sweep

    files = [Path(scenarios)] if isinstance(scenarios, (str, Path)) else [Path(path) for path in scenarios]
    if not files:
        raise ScenarioError("scenarios: give at least one scenario file")
    algorithm_names = (algorithms,) if isinstance(algorithms, str) else tuple(algorithms) if algorithms else None
    seed_values = tuple(_seed(seed) for seed in seeds) if seeds else None
    plan, runs = sweep_plan(files, algorithm_names, seed_values, tuple(_override_texts(overrides)), Path(out) if out is not None else None,
                            out_key="out: the sweep folder is required (sweep(files, out=SWEEP_DIR))")  # fmt: skip
    if _needs_pinned_process([run.scenario for run in runs]):
        return _sweep_pinned(plan, runs, parallel, replace_changed, progress)
    printer = _printer(progress)
    printer(f"sweep: {len(runs)} runs into {plan.out}")
    finished = {"count": 0}

    def on_progress(key: str, status: str) -> None:
        if status not in ("started", "resuming") and not status.startswith("settings changed"):
            finished["count"] += 1
        printer(f"[{finished['count']}/{len(runs)}] {key}: {status}")

    try:
        outcome = run_sweep(runs, plan.out, runs[0].scenario.runtime, parallel, on_progress, replace_changed=replace_changed)
    except ClusterLostError as error:
        raise RuntimeError(str(error)) from None
    return SweepResult(
        dir=plan.out,
        runs=[Run(run.run_dir) for run in runs if (run.run_dir / "scenario.yaml").is_file()],
        completed=list(outcome.completed),
        skipped=list(outcome.skipped),
        failed=dict(outcome.failed),
    )


def sweep_plan(
    files: Sequence[Path],
    algorithms: tuple[str, ...] | None,
    seeds: tuple[int, ...] | None,
    overrides: tuple[str, ...],
    out: Path | None,
    out_key: str = "--out SWEEP_DIR is required",
) -> tuple[Any, list[Any]]:
    """The one reading of a sweep's inputs, for `hdcfl-ray sweep` and `hdcfl_ray.sweep`:
    scenario files (or one sweep file, its lists overridden by those given), and every
    run of the grid. Returns (the plan, its runs); ScenarioError names a bad input."""
    from hdcfl_ray.config.loading import read_scenario_file
    from hdcfl_ray.sweeps.grid import SweepPlan, expand, read_sweep_file

    for path in files:
        if not Path(path).is_file():
            raise ScenarioError(f"{path}: no such file")
    if len(files) == 1 and "scenarios" in read_scenario_file(files[0]):
        plan = read_sweep_file(files[0], out)
        plan = SweepPlan(plan.scenario_files, algorithms or plan.algorithms, seeds if seeds is not None else plan.seeds,
                         plan.overrides + overrides, plan.out)  # fmt: skip
    else:
        if out is None:
            raise ScenarioError(out_key)
        plan = SweepPlan(tuple(files), algorithms, seeds, overrides, out)
    return plan, expand(plan)


def _sweep_pinned(plan: Any, runs: list[Any], parallel: int | None, replace_changed: bool, progress: bool) -> SweepResult:
    """A portable sweep in a fresh pinned process (`hdcfl-ray sweep`), its outcome read
    from the runs' folders here."""
    from hdcfl_ray.logs.manifest import read_manifest
    from hdcfl_ray.portable.child import run_command_pinned
    from hdcfl_ray.sweeps.index import run_status

    before = {run.key: run_status(run) for run in runs}
    arguments = ["sweep", *map(str, plan.scenario_files), "--out", str(plan.out)]
    if plan.algorithms:
        arguments += ["--algorithms", ",".join(plan.algorithms)]
    if plan.seeds:
        arguments += ["--seeds", ",".join(map(str, plan.seeds))]
    for override in plan.overrides:
        arguments += ["--set", override]
    if parallel is not None:
        arguments += ["--parallel", str(parallel)]
    if replace_changed:
        arguments.append("--replace-changed")
    if not progress:
        arguments.append("--quiet")
    _printer(progress)("runtime.portable: this Python was not started with the portable environment; the sweep goes to a fresh pinned process")
    try:
        run_command_pinned(arguments, print if progress else None)
    except RuntimeError:  # exit 1: some runs failed; the others are read back below
        pass
    completed, skipped, failed = [], [], {}
    for run in runs:
        manifest = read_manifest(run.run_dir) if (run.run_dir / "manifest.json").is_file() else None
        status = (manifest or {}).get("status")
        if before[run.key] == "completed":
            skipped.append(run.key)
        elif status == "completed":
            completed.append(run.key)
        else:
            # plain text: a manifest written before errors were stored plain may hold terminal codes
            failed[run.key] = plain_text(str((manifest or {}).get("error") or f"status {status or 'not started'}"))
    return SweepResult(
        dir=plan.out,
        runs=[Run(run.run_dir) for run in runs if (run.run_dir / "scenario.yaml").is_file()],
        completed=completed,
        skipped=skipped,
        failed=failed,
    )


def _seed(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(f"seeds: {value!r} is not an integer; give integers, e.g. [42, 123, 2026]")
    return value


def report(
    paths: PathLike | Run | Iterable[PathLike | Run],
    format: str = "md",
    against: str | None = None,
    keep_duplicate: str | None = None,
) -> str:
    """The report tables of finished runs, as `hdcfl-ray report --format FORMAT`:
    md (Markdown), csv, latex, or table (the terminal tables as plain text).
    paths: run directories, sweep folders, folders that hold run directories, or Runs.
    against: the method (or output.label) the paired table compares every other one with (default hdcfl).
    keep_duplicate: "newest" or "oldest", which of two runs of the same method, setting and
    seed to keep; without it such runs raise ScenarioError naming both folders.
    Runs are averaged only where their resolved scenarios agree in all but the seed and the
    keys a rerun may change. Unfinished runs are left out (with a warning); runs scored on
    validation images are listed in a table of their own, never in a test table, rank or
    macro value (docs/cli.md, "What a report says it left out")."""
    if format not in REPORT_FORMATS:
        raise ScenarioError(f"--format {format!r}: choose table, md, csv or latex")
    items = [paths] if isinstance(paths, (str, Path, Run)) else list(paths)
    folders = [item.dir if isinstance(item, Run) else Path(item) for item in items]
    tables, _ = report_tables(folders, against, keep_duplicate, lambda text: warnings.warn(text, stacklevel=3), 'keep_duplicate="{}"')
    return render_report(tables, format)


def report_tables(
    folders: Sequence[Path],
    against: str | None,
    keep_duplicate: str | None,
    notice: Callable[[str], None],
    duplicate_option: str = "--keep-duplicate {}",
) -> tuple[list[Any], list[Any]]:
    """The one implementation of a report, for `hdcfl-ray report` and `hdcfl_ray.report`:
    the runs under `folders` read, checked and placed into settings, and their tables;
    what was left out said through `notice`. Returns (tables, the runs placed), or raises
    ScenarioError before anything is computed when an input cannot be read."""
    from analysis.final_metrics import run_metrics
    from analysis.report_tables import all_tables
    from analysis.runs import left_out_note, load_runs, unfinished
    from analysis.setting_groups import duplicates_note, place_runs
    from hdcfl_ray.logs.table_writer import unreadable_parts

    missing = [str(path) for path in folders if not Path(path).exists()]
    if missing:
        raise ScenarioError(f"no such run directory: {', '.join(missing)}")
    try:
        damaged = unreadable_parts(list(folders))
        if damaged:
            listed = "; ".join(f"{path} ({reason})" for path, reason in damaged[:10])
            more = f" and {len(damaged) - 10} more" if len(damaged) > 10 else ""
            raise ScenarioError(
                f"report: {len(damaged)} table part(s) cannot be read: {listed}{more}. Resume an unfinished run with "
                "hdcfl-ray simulate --resume RUN_DIR (it redoes a damaged round), or leave the run out of the report"
            )
        runs = load_runs(list(folders))
    except (OSError, ValueError) as error:  # pyarrow's errors are ValueError or OSError subclasses
        raise ScenarioError(f"report: the runs cannot be read ({type(error).__name__}: {error})") from None
    left_out = unfinished(runs)
    if left_out:  # a half-finished run would mix rounds into the final-round tables
        notice(f"left out {len(left_out)} unfinished run(s): " + ", ".join(f"{run.run_dir} ({run.status})" for run in left_out))
    validation_scored = [run for run in runs if run.scored_on_validation]
    if validation_scored:
        notice(
            f"note: {len(validation_scored)} run(s) were scored on validation images held out of the clients' training "
            "data (partition.validation_fraction), not on the test set: they are listed apart, in the table 'Validation-scored "
            "runs', and enter no test table, rank or macro value"
        )
    placement = place_runs([run for run in runs if run.finished], keep_duplicate, option=duplicate_option)
    if placement.duplicates:
        notice(duplicates_note(placement.duplicates, keep_duplicate))
    records = run_metrics(placement.runs)
    if not records:
        raise ScenarioError(
            f"no completed runs (folders with scenario.yaml and a completed manifest) under {', '.join(map(str, folders))}"
        )
    notes = " ".join(note for note in (left_out_note(left_out), duplicates_note(placement.duplicates, keep_duplicate)) if note)
    return all_tables(records, against, notes), placement.runs


def render_report(tables: list[Any], format: str) -> str:
    """The tables as text: md, csv, latex, or table (the terminal tables, plain)."""
    from analysis.report_tables import to_csv, to_latex, to_markdown, to_rich

    if format == "table":
        from rich.console import Console

        buffer = io.StringIO()
        console = Console(file=buffer, width=160, color_system=None)
        for rendered in to_rich(tables):
            console.print(rendered)
        return buffer.getvalue()
    return {"md": to_markdown, "markdown": to_markdown, "csv": to_csv, "latex": to_latex}[format](tables)


def _printer(enabled: bool):
    if not enabled:
        return lambda text: None
    from rich.console import Console

    console = Console()
    return lambda text: console.print(text, highlight=False, markup=False)


def _silent_observer() -> Any:
    """A quiet run's observer that keeps its notices (a damaged checkpoint passed over)
    instead of printing them."""
    from hdcfl_ray.terminal.live_view import QuietObserver

    class SilentObserver(QuietObserver):
        def __init__(self) -> None:
            self.notices: list[str] = []

        def on_notice(self, text: str) -> None:
            self.notices.append(text)

    return SilentObserver()
