"""Scenario values that become paths, checked against what a file system takes, so a
valid scenario never fails later when its run folder or a data file is opened.

A file or folder name is at most 255 bytes on the usual file systems (ext4, XFS,
APFS, NTFS) and a path at most 4096 (Linux's PATH_MAX); a NUL byte ends a path in
C, so Python refuses it outright. `name` is capped lower, at `MAX_NAME_CHARS`,
because a run folder is `<name>-<algorithm>-seed<seed>-<time>` and a sweep's
folder `<out>/<name>/<algorithm>/seed<seed>`: the cap leaves room for the rest."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from hdcfl_ray.config.safe_yaml import clip
from hdcfl_ray.errors import ScenarioError

MAX_NAME_CHARS = 100
MAX_COMPONENT_BYTES = 255
MAX_PATH_BYTES = 4096

# every key whose value is a path or a part of one
PATH_KEYS = (
    "output.dir",
    "dataset.path",
    "dataset.train_file",
    "dataset.test_file",
    "model.pretrained",
    "protocol.system.trace",
)


def path_problem(value: str) -> str | None:
    """Why `value` cannot be a path on this machine, or None."""
    if "\x00" in value:
        return "holds a NUL byte, which no path can"
    encoded = os.fsencode(value)
    if len(encoded) > MAX_PATH_BYTES:
        return f"is {len(encoded)} bytes long; a path is at most {MAX_PATH_BYTES}"
    longest = max((part for part in encoded.split(b"/")), key=len, default=b"")
    if len(longest) > MAX_COMPONENT_BYTES:
        return (
            f"has a file or folder name of {len(longest)} bytes ({clip(os.fsdecode(longest), 40)}); "
            f"a name is at most {MAX_COMPONENT_BYTES}"
        )
    return None


def check_path_lengths(scenario: BaseModel, source: str = "scenario") -> None:
    """Raise ScenarioError listing `name` and every path key a file system would refuse."""
    problems: list[str] = []
    name = getattr(scenario, "name", None)
    if isinstance(name, str) and len(name) > MAX_NAME_CHARS:
        problems.append(
            f"  name: {len(name)} characters ({clip(name, 40)}); at most {MAX_NAME_CHARS}, since run folders are named after it"
        )
    for key in PATH_KEYS:
        value = _lookup(scenario, key.split("."))
        if isinstance(value, str):
            problem = path_problem(value)
            if problem is not None:
                problems.append(f"  {key}: {clip(repr(value), 60)} {problem}")
    if problems:
        raise ScenarioError("\n".join([f"{source}: invalid scenario", *problems]))


def _lookup(model: Any, parts: list[str]) -> Any:
    for part in parts:
        model = getattr(model, part, None)
        if model is None:
            return None
    return model


def check_writable(path: Path, option: str, kind: str = "file") -> None:
    """Make sure an output (`kind` "file" or "folder") can be written before any work is
    done for it: the folder that will hold it is created if missing and a probe file
    is written and removed there (a permission bit says little to root, a read-only
    mount or a file in the way says everything). A ScenarioError names `option`."""
    import tempfile

    path = Path(path)
    problem = path_problem(str(path))
    if problem is not None:
        raise ScenarioError(f"{option} {clip(str(path), 80)}: {problem}")
    if kind == "file" and path.is_dir():
        raise ScenarioError(f"{option} {path}: this is a folder; give a file name")
    if kind == "folder" and path.exists() and not path.is_dir():
        raise ScenarioError(f"{option} {path}: this is a file, not a folder; give a folder")
    folder = path if kind == "folder" else path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".hdcfl-write-probe-"):
            pass
    except OSError as exc:
        raise ScenarioError(f"{option} {path}: cannot write in {folder} ({exc.strerror or exc}); choose a writable place") from None
