"""Importing a repository script (a file outside the package, such as a scenario's
probe or a cross-check side) as a module, so tests can call its functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPOSITORY = Path(__file__).resolve().parents[1]


def load_script(path: Path, name: str) -> ModuleType:
    """The module in PATH, registered under NAME (dataclasses resolve their module by name)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, f"not a Python file: {path}"
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
