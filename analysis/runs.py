"""Load run directories: the resolved scenario, the manifest and the Parquet tables."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml

from hdcfl_ray.auto_knobs.cache import CACHE_FOLDER
from hdcfl_ray.logs.table_writer import read_table


@dataclass(frozen=True)
class RunRecord:
    run_dir: Path
    scenario: dict[str, Any]
    manifest: dict[str, Any]
    rounds: pa.Table
    clients: pa.Table
    refresh: pa.Table
    # The report's column and row for this run, given by analysis.setting_groups once
    # every run of the report is known (None until then: the name-based labels below).
    column: str | None = None
    row: str | None = None

    @property
    def setting(self) -> str:
        """The report's column: `column` once the runs are placed (their resolved
        scenarios, not their names, say which runs are one setting); before that the
        scenario's name, with runs scored on held-out training images instead of the test
        set (`partition.validation_fraction`) a setting of their own."""
        return self.column if self.column is not None else self.scenario_label

    @property
    def scenario_label(self) -> str:
        """The scenario's name, marked `(validation)` for a validation-scored run."""
        name = str(self.scenario.get("name"))
        return f"{name} (validation)" if self.scored_on_validation else name

    @property
    def scored_on_validation(self) -> bool:
        return (self.scenario.get("partition") or {}).get("validation_fraction") is not None

    @property
    def algorithm(self) -> str:
        return str(self.scenario["algorithm"]["name"])

    @property
    def method(self) -> str:
        """The report's row: the algorithm, or a variant of it whose budget or design
        differs enough to be its own row (`method_label`), and once the runs are placed
        (analysis.setting_groups) a variant of its knobs where runs of it differ in them."""
        return self.row if self.row is not None else method_label(self.scenario)

    @property
    def started_at(self) -> str:
        """When the run started (the manifest's ISO time; '' when it has none)."""
        return str(self.manifest.get("started_at") or "")

    @property
    def seed(self) -> int:
        return int(self.scenario["seed"])

    @property
    def status(self) -> str:
        return str(self.manifest.get("status", "unknown"))

    def final_evaluated_round(self) -> dict[str, Any] | None:
        rows = [row for row in self.rounds.to_pylist() if row["evaluated"]]
        return max(rows, key=lambda row: row["round"]) if rows else None

    @property
    def finished(self) -> bool:
        """Completed and evaluated: a half-finished run would mix rounds into final-round tables."""
        return self.status == "completed" and self.final_evaluated_round() is not None


def method_label(scenario: dict[str, Any]) -> str:
    """The scenario's `output.label` where it sets one (a variant the user named). Else the
    algorithm; FedSoft training every client each round spends about 1/participation times
    the others' budget, so it is reported as `fedsoft-all`, never mixed with budget-equal FedSoft."""
    label = (scenario.get("output") or {}).get("label")
    if label:
        return str(label)
    algorithm = scenario.get("algorithm") or {}
    name = str(algorithm.get("name"))
    if name == "fedsoft" and (algorithm.get("fedsoft") or {}).get("selection_mode") == "all_clients":
        return "fedsoft-all"
    return name


def load_run(run_dir: str | Path) -> RunRecord:
    run_dir = Path(run_dir)
    scenario_path = run_dir / "scenario.yaml"
    if not scenario_path.is_file():
        raise FileNotFoundError(f"{run_dir}: not a run directory (no scenario.yaml)")
    manifest_path = run_dir / "manifest.json"
    return RunRecord(
        run_dir=run_dir,
        scenario=yaml.safe_load(scenario_path.read_text()),
        manifest=json.loads(manifest_path.read_text()) if manifest_path.is_file() else {},
        rounds=read_table(run_dir, "rounds"),
        clients=read_table(run_dir, "clients"),
        refresh=read_table(run_dir, "refresh"),
    )


def find_run_dirs(paths: list[str | Path]) -> list[Path]:
    """Run directories among `paths`, each either a run or a folder of runs (searched recursively)."""
    found: list[Path] = []
    for path in map(Path, paths):
        if (path / "scenario.yaml").is_file():
            found.append(path)
        elif path.is_dir():
            # the candidate runs an `auto` knob was chosen with are evidence, not runs of the setting:
            # found only when their folder is named (hdcfl_ray/auto_knobs/cache.py)
            found.extend(sorted(p.parent for p in path.rglob("scenario.yaml") if CACHE_FOLDER not in p.relative_to(path).parts))
    return sorted(set(found))


def load_runs(paths: list[str | Path]) -> list[RunRecord]:
    return [load_run(run_dir) for run_dir in find_run_dirs(paths)]


def unfinished(runs: list[RunRecord]) -> list[RunRecord]:
    """The runs a report leaves out: killed, failed or still running, or never evaluated."""
    return [run for run in runs if not run.finished]


def left_out_note(runs: list[RunRecord]) -> str:
    """'Left out: ...' naming each unfinished run by setting, method, seed and status ('' when none)."""
    if not runs:
        return ""
    named = ", ".join(sorted(f"{run.setting}/{run.method} seed {run.seed} ({run.status})" for run in runs))
    return f"Left out of every table: {len(runs)} unfinished run(s): {named}."
