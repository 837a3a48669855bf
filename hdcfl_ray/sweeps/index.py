"""SWEEP_DIR/index.json: one entry per run (setting, algorithm, seed, status, run dir),
rewritten atomically as runs finish, so a crashed sweep knows what is done."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hdcfl_ray.durable_files import write_text_durably
from hdcfl_ray.logs.manifest import read_manifest
from hdcfl_ray.sweeps.grid import SweepRun

# What a run folder holds before its run has computed anything: the resolved scenario.
_UNSTARTED_FILES = frozenset({"scenario.yaml", ".scenario.yaml.tmp", ".lock"})


def run_status(run: SweepRun) -> str:
    """completed | partial (a killed run: resumable) | pending (nothing computed yet).
    A damaged manifest is a ScenarioError naming the file, raised before anything runs."""
    if not run.run_dir.is_dir() or is_unstarted(run.run_dir):
        return "pending"
    manifest = read_manifest(
        run.run_dir,
        fix="it only records provenance and status: delete it and rerun the sweep, which resumes this run from its checkpoint",
    )
    if manifest is None:  # killed after logging began but before the manifest: resume
        return "partial"
    return "completed" if manifest.get("status") == "completed" else "partial"


def is_unstarted(run_dir: Path) -> bool:
    """A run folder killed before its run wrote anything but the scenario."""
    return {path.name for path in run_dir.iterdir()} <= _UNSTARTED_FILES


def write_index(out: Path, runs: list[SweepRun], statuses: dict[str, str]) -> Path:
    """This sweep's runs, after the entries an earlier sweep into the same folder left
    for other runs (another method list, say), so the index lists every run there."""
    entries: list[dict[str, Any]] = [
        {
            "setting": run.setting,
            "algorithm": run.algorithm,
            "seed": run.seed,
            "status": statuses.get(run.key, "pending"),
            "run_dir": str(run.run_dir.relative_to(out)),
        }
        for run in runs
    ]
    out.mkdir(parents=True, exist_ok=True)
    path = out / "index.json"
    ours = {entry["run_dir"] for entry in entries}
    earlier = [entry for entry in _earlier_entries(path) if entry.get("run_dir") not in ours]
    write_text_durably(path, json.dumps({"runs": earlier + entries}, indent=1))
    return path


def _earlier_entries(path: Path) -> list[dict[str, Any]]:
    """The entries of an existing index; an unreadable one (it is only a listing: the
    run folders hold the results) is rebuilt from this sweep's runs alone."""
    try:
        runs = json.loads(path.read_text())["runs"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [entry for entry in runs if isinstance(entry, dict)] if isinstance(runs, list) else []
