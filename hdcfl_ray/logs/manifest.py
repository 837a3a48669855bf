"""manifest.json: what produced a run (versions, seed, hardware, git revision)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

_PACKAGES = ("hdcfl-ray", "torch", "torchvision", "ray", "numpy", "scikit-learn", "pyarrow", "pydantic")


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_revision(directory: Path) -> str | None:
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=directory, capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() or None if result.returncode == 0 else None


def hardware() -> dict[str, Any]:
    info: dict[str, Any] = {
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
    }
    try:
        import torch

        info["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        info["cuda_available"] = False
    return info


def write_manifest(run_dir: Path, seed: int, scenario_name: str, extra: dict[str, Any]) -> dict[str, Any]:
    manifest = {
        "scenario": scenario_name,
        "seed": seed,
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": sys.argv,
        "packages": package_versions(),
        "hardware": hardware(),
        "git_revision": git_revision(Path(__file__).resolve().parent),
        **extra,
    }
    (run_dir / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str))
    return manifest


def update_manifest(run_dir: Path, **fields: Any) -> None:
    path = run_dir / "manifest.json"
    manifest = json.loads(path.read_text()) if path.exists() else {}
    manifest.update(fields)
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(manifest, indent=2, default=str))
    os.replace(temporary, path)
