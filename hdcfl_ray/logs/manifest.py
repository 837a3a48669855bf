"""manifest.json: what produced a run (versions, seed, hardware, git revision) and its
status; always replaced whole (temporary file, fsync, rename), never edited in place."""

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

from hdcfl_ray.durable_files import write_text_durably
from hdcfl_ray.errors import ScenarioError

MANIFEST = "manifest.json"
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


def cpu_model() -> str | None:
    """The CPU's marketing name (Linux: /proc/cpuinfo's "model name"): CPUs of other
    vendors round some float operations differently, so results cite it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return platform.processor() or None


# what a run's results cannot depend on: documentation (a long script that writes its
# report into docs/ between runs must not mark its later runs as made from changed code)
# and results/, the finished runs kept in the repository, which a comparison saves and
# replaces between runs (a weights file kept there is recorded by its sha256 instead)
_NOT_CODE = (":(top,exclude)docs", ":(top,exclude,glob)**/*.md", ":(top,exclude)results")


def git_dirty(directory: Path) -> bool | None:
    """True when tracked files other than documentation differ from the recorded revision
    (the run's code is not exactly that commit); None outside a git checkout."""
    try:
        result = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ":(top)", *_NOT_CODE],
            cwd=directory, capture_output=True, text=True, timeout=5, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return bool(result.stdout.strip()) if result.returncode == 0 else None


def hardware() -> dict[str, Any]:
    info: dict[str, Any] = {
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
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


def plugin_records() -> list[dict[str, Any]]:
    """Every plugin this process has loaded (methods, partitions, sources, transforms,
    encoders), each with its name, package and version."""
    from hdcfl_ray.plugins import KINDS, plugin_specs

    return [
        {"kind": kind[:-1], "name": name, **origin.as_dict()}
        for kind in KINDS
        for name, (_, origin) in plugin_specs(kind).items()
    ]


def write_manifest(run_dir: Path, seed: int, scenario_name: str, extra: dict[str, Any]) -> dict[str, Any]:
    manifest = {
        "scenario": scenario_name,
        "seed": seed,
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": sys.argv,
        "packages": package_versions(),
        "plugins": plugin_records(),
        "hardware": hardware(),
        "git_revision": git_revision(Path(__file__).resolve().parent),
        "git_dirty": git_dirty(Path(__file__).resolve().parent),
        **extra,
    }
    write_text_durably(run_dir / MANIFEST, json.dumps(manifest, indent=2, default=str))
    return manifest


def read_manifest(run_dir: Path, fix: str | None = None) -> dict[str, Any] | None:
    """The run's manifest, or None when it has none; a damaged one (empty, truncated,
    not a JSON object) is a ScenarioError naming the file and `fix` (what to do)."""
    path = Path(run_dir) / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, OSError) as exc:
        manifest, problem = None, f"{type(exc).__name__}: {exc}" if path.stat().st_size else "the file is empty"
    else:
        problem = None if isinstance(manifest, dict) else "not a JSON object"
    if problem is not None:
        remedy = fix or f"it only records provenance and status: delete it and resume with `hdcfl-ray simulate --resume {run_dir}`, which writes a new one"
        raise ScenarioError(f"{path}: damaged manifest ({problem}); {remedy}")
    return manifest


def update_manifest(run_dir: Path, **fields: Any) -> None:
    manifest = read_manifest(run_dir) or {}
    manifest.update(fields)
    write_text_durably(Path(run_dir) / MANIFEST, json.dumps(manifest, indent=2, default=str))
