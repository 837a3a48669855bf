"""SWEEP_DIR/index.json: one entry per run (setting, algorithm, seed, status, run dir),
rewritten atomically as runs finish, so a crashed sweep knows what is done."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hdcfl_ray.sweep.grid import SweepRun


def run_status(run: SweepRun) -> str:
    """completed | partial (a killed run: resumable) | pending."""
    manifest = run.run_dir / "manifest.json"
    if not manifest.is_file():
        return "pending"
    status = json.loads(manifest.read_text()).get("status")
    return "completed" if status == "completed" else "partial"


def write_index(out: Path, runs: list[SweepRun], statuses: dict[str, str]) -> Path:
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
    temporary = out / ".index.json.tmp"
    temporary.write_text(json.dumps({"runs": entries}, indent=1))
    os.replace(temporary, path)
    return path
