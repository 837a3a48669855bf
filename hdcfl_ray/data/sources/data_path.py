"""How a data source names a `dataset.path` that is not there: a relative path is read
from the folder the command runs in, not from the scenario file's, so the error says
which folder that was (the shipped scenarios name their data relative to the repository
root, and a run started elsewhere would otherwise read "does not exist" with no why)."""

from __future__ import annotations

import os
from pathlib import Path


def absent(path: Path) -> str:
    """`path` and why it was not found, for an error that goes on with what was expected."""
    if path.exists():
        return f"{path} is not a folder"
    if path.is_absolute():
        return f"{path} does not exist"
    return (
        f"{path} does not exist (a relative path is read from the folder the command runs in, {os.getcwd()}: "
        "run from the folder it is relative to, the repository root for the shipped scenarios, or give an absolute path)"
    )
