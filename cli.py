"""The `hdcfl-ray` command line.

Exit codes: 0 success, 2 bad input (scenario, overrides, data files), 1 a failure
during the run.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from hdcfl_ray.errors import ScenarioError

app = typer.Typer(
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
    error_console.print(f"[bold red]error:[/] {error}", highlight=False, soft_wrap=True)
    raise typer.Exit(EXIT_BAD_INPUT)


@app.command()
def validate(
    scenario_file: Path = typer.Argument(..., help="Scenario YAML file."),
    overrides: Optional[List[str]] = SetOption,
) -> None:
    """Check a scenario (schema, data files, partition against the data) without running it."""
    from hdcfl_ray.config import load_scenario
    from hdcfl_ray.runtime.simulation import prepare_run

    try:
        scenario = load_scenario(scenario_file, overrides or [])
        prepared = prepare_run(scenario)
    except ScenarioError as error:
        _fail_bad_input(error)
    dataset = prepared.dataset
    print(
        f"{scenario_file}: valid. {scenario.algorithm.name} on {dataset.name} "
        f"({dataset.train_labels.shape[0]} train / {dataset.test_labels.shape[0]} test images, {dataset.num_classes} classes), "
        f"{scenario.partition.num_clients} clients ({scenario.partition.kind}), {scenario.protocol.rounds} rounds."
    )


@app.command()
def simulate(
    scenario_file: Optional[Path] = typer.Argument(None, help="Scenario YAML file (omit with --resume)."),
    overrides: Optional[List[str]] = SetOption,
    out: Optional[Path] = typer.Option(None, "--out", help="Run directory (default: <output.dir>/<name>-<algorithm>-seed<seed>-<time>)."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Continue the killed run in this run directory from its last checkpoint."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No live view or summary; print only the run directory."),
) -> None:
    """Run one simulation and write its run directory (scenario, manifest, Parquet tables)."""
    from hdcfl_ray.config import load_scenario
    from hdcfl_ray.runtime.simulation import default_run_dir, prepare_run, resumable_run, run_simulation
    from hdcfl_ray.terminal.live_view import LiveView, QuietObserver

    try:
        if resume is not None:
            if scenario_file is not None or out is not None:
                raise ScenarioError("--resume RUN_DIR takes neither a scenario file nor --out: the run directory holds both")
            if any(not text.startswith("runtime.") for text in overrides or []):
                raise ScenarioError("--resume: only runtime.* keys may be overridden (the run's results must not change)")
            scenario = resumable_run(resume)
            if overrides:
                scenario = load_scenario(resume / "scenario.yaml", overrides)
        elif scenario_file is None:
            raise ScenarioError("give a scenario file (hdcfl-ray simulate SCENARIO) or --resume RUN_DIR")
        else:
            scenario = load_scenario(scenario_file, overrides or [])
        prepared = prepare_run(scenario)
    except ScenarioError as error:
        _fail_bad_input(error)
    run_dir = resume or out or default_run_dir(scenario)
    observer = QuietObserver() if quiet else LiveView()
    if not quiet:
        dataset = prepared.dataset
        Console().print(
            f"[dim]{dataset.name}: {dataset.train_labels.shape[0]} train / {dataset.test_labels.shape[0]} test images; "
            f"starting Ray and the client actors ...[/]",
            highlight=False,
        )
    try:
        summary = run_simulation(prepared, run_dir, observer, resume=resume is not None)
    except ScenarioError as error:
        if isinstance(observer, LiveView):
            observer.abort()
        _fail_bad_input(error)
    except KeyboardInterrupt:
        if isinstance(observer, LiveView):
            observer.abort()
        error_console.print(f"interrupted; finished rounds are in {run_dir}; continue with: hdcfl-ray simulate --resume {run_dir}")
        raise typer.Exit(130)
    except Exception as error:  # a failure during the run: say what and where the partial logs are
        if isinstance(observer, LiveView):
            observer.abort()
        error_console.print(f"[bold red]run failed:[/] {type(error).__name__}: {error}", highlight=False)
        error_console.print(f"finished rounds are in {run_dir}; continue with: hdcfl-ray simulate --resume {run_dir}")
        raise typer.Exit(EXIT_RUN_FAILED)
    if quiet:
        print(summary.run_dir)


@app.command()
def report(
    paths: List[Path] = typer.Argument(..., help="Run directories, or folders that hold run directories."),
    output_format: str = typer.Option("table", "--format", help="table (terminal), markdown or csv."),
) -> None:
    """Final-round client accuracy per setting and method: mean +- sample std over seeds."""
    from rich.table import Table

    from analysis.final_metrics import METRICS, final_metrics_table, format_markdown
    from analysis.runs import load_runs

    if output_format not in ("table", "markdown", "csv"):
        _fail_bad_input(ScenarioError(f"--format {output_format!r}: choose table, markdown or csv"))
    missing = [str(path) for path in paths if not path.exists()]
    if missing:
        _fail_bad_input(ScenarioError(f"no such run directory: {', '.join(missing)}"))
    runs = load_runs(list(paths))
    if not runs:
        _fail_bad_input(ScenarioError(f"no run directories (folders with scenario.yaml) under {', '.join(map(str, paths))}"))
    rows = final_metrics_table(runs)
    if output_format == "markdown":
        print(format_markdown(rows))
        return
    if output_format == "csv":
        print("setting,algorithm,seeds," + ",".join(f"{m},{m}_std" for m in METRICS))
        for row in rows:
            values = ",".join(f"{row.means[m]:.6f},{row.stds[m]:.6f}" for m in METRICS)
            print(f"{row.setting},{row.algorithm},{' '.join(map(str, row.seeds))},{values}")
        return
    table = Table(title=f"Final client test accuracy (%), mean ± sample std over seeds ({len(runs)} runs)")
    for column in ("setting", "method", "seeds", "mean", "worst", "bottom-20%", "gap (pp)", "global enc. mean"):
        table.add_column(column)
    for line in format_markdown(rows).splitlines()[2:]:
        table.add_row(*[cell.strip() for cell in line.strip("|").split("|")])
    Console().print(table)


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
