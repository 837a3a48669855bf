"""A sweep rerun against the runs already on disk. Each run's resolved scenario is
compared with its `RUN_DIR/scenario.yaml` before anything runs: a run made with other
settings is never skipped as complete nor resumed with the new ones, since either
would put results of two settings under one name. Such runs are started afresh only
when the user asks, and their old folders are moved aside, not deleted."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from hdcfl_ray.config.loading import build_scenario, read_scenario_file
from hdcfl_ray.config.safe_keys import (  # noqa: F401  (re-exported: the names callers know)
    ARITHMETIC_KEYS,
    RERUN_SAFE_KEYS,
    RERUN_SAFE_PREFIXES,
    comparable,
    flatten,
    may_differ,
    own_sections,
    safe_keys_text,
)
from hdcfl_ray.config.schema import Scenario  # noqa: F401
from hdcfl_ray.config.setting_changes import SettingChange, setting_changes  # noqa: F401  (re-exported for the sweep's callers)
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.sweeps.grid import SweepRun

# What may differ between a run and its rerun is defined once, beside the schema
# (hdcfl_ray/config/safe_keys.py), for sweep reruns, `simulate --resume` and the
# settings reports group runs by; the names stay importable from here.
REPLACE_OPTION = "--replace-changed"

@dataclass(frozen=True)
class ChangedRun:
    run: SweepRun
    status: str  # completed | partial
    changes: tuple[SettingChange, ...]
    unreadable: str | None = None  # why RUN_DIR/scenario.yaml could not be compared

    def describe(self) -> list[str]:
        lines = [f"  {self.run.key} ({self.status}, {self.run.run_dir}):"]
        if self.unreadable is not None:
            lines.append(f"    {self.run.run_dir / 'scenario.yaml'}: {self.unreadable}")
        lines.extend(f"    {change.describe()}" for change in self.changes)
        return lines


class SettingsChangedError(ScenarioError):
    """Runs on disk were made with other settings than the rerun asks for."""


def changed_runs(runs: list[SweepRun], statuses: dict[str, str]) -> list[ChangedRun]:
    """Runs that already hold results (completed or partial) made with other settings."""
    changed: list[ChangedRun] = []
    for run in runs:
        status = statuses[run.key]
        if status not in ("completed", "partial"):
            continue
        path = run.run_dir / "scenario.yaml"
        if not path.is_file():
            changed.append(ChangedRun(run, status, (), unreadable="missing, so the settings of its results are unknown"))
            continue
        try:
            on_disk = build_scenario(own_sections(read_scenario_file(path)), source=str(path))
        except ScenarioError as exc:
            reason = str(exc).replace("\n", " ")
            changed.append(ChangedRun(run, status, (), unreadable=f"not readable as a scenario of this version ({reason})"))
            continue
        changes = setting_changes(on_disk, run.scenario)
        if changes:
            changed.append(ChangedRun(run, status, tuple(changes)))
    return changed


def replaced_folder(out: Path, when: datetime | None = None) -> Path:
    """Where the old folders of replaced runs go: a sibling of the sweep folder, so
    `hdcfl-ray report SWEEP_DIR` never reads them with the new runs."""
    return _replaced_pattern(out, (when or datetime.now()).strftime("%Y%m%d-%H%M%S"))


def _replaced_pattern(out: Path, stamp: str = "<time>") -> Path:
    out = Path(out).resolve()
    return out.parent / f"{out.name}.replaced-{stamp}"


def settings_changed_message(changed: list[ChangedRun], out: Path) -> str:
    lines = [f"sweep {out}: {len(changed)} run(s) on disk were made with other settings; nothing was run."]
    for item in changed:
        lines.extend(item.describe())
    safe = safe_keys_text()
    lines.append(
        "Skipping or resuming them would mix two settings under one name. Rerun with the settings they were made with, "
        f"give a new --out, or add {REPLACE_OPTION} to start these runs afresh (their old folders are moved to "
        f"{_replaced_pattern(out)}/ first; nothing is deleted). "
        f"Only {safe} may differ between a run and its rerun."
    )
    return "\n".join(lines)


def move_aside(changed: list[ChangedRun], out: Path) -> dict[str, Path]:
    """Move each changed run's folder under `replaced_folder(out)`; returns run key -> new place."""
    destination_root = replaced_folder(out)
    moved: dict[str, Path] = {}
    for item in changed:
        relative = item.run.run_dir.resolve().relative_to(Path(out).resolve())
        destination = destination_root / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(item.run.run_dir), str(destination))
        moved[item.run.key] = destination
    return moved
