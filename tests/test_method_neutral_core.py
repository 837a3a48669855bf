"""The runtime, the logs, the configuration and the contract name no method: no
import of a method's module (or HDC-FL's maths), no comparison with a method's
name, no dictionary keyed by one. A method reaches them only through its
MethodSpec and hooks, as a plugin's would."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hdcfl_ray.algorithms.registry import builtin_method_specs

PACKAGE = Path(__file__).resolve().parents[1] / "hdcfl_ray"
CORE = ("runtime", "logs", "config", "contract", "auto_knobs")
# "local" is also a backend's name (runtime.backend: local), compared with in the runtime
METHOD_NAMES = set(builtin_method_specs()) - {"local"}
# the generic entries into hdcfl_ray/algorithms: the registry of the methods'
# declarations, and the asynchronous protocol's mixing rules (FedAsync, FedBuff)
ALLOWED_IMPORTS = {"hdcfl_ray.algorithms.registry", "hdcfl_ray.algorithms.async_mixing"}


def core_files() -> list[Path]:
    return sorted(path for folder in CORE for path in (PACKAGE / folder).rglob("*.py"))


def imported_modules(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return names


@pytest.mark.parametrize("path", core_files(), ids=lambda path: str(path.relative_to(PACKAGE)))
def test_a_core_module_names_no_method(path: Path) -> None:
    tree = ast.parse(path.read_text())
    for module in imported_modules(tree):
        assert not module.startswith("hdcfl_ray.hdcfl"), f"{path.name} imports {module}"
        if module.startswith("hdcfl_ray.algorithms.") and module not in ALLOWED_IMPORTS:
            assert module.rsplit(".", 1)[0] in ALLOWED_IMPORTS, f"{path.name} imports {module}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            constants = [part for part in (node.left, *node.comparators) if isinstance(part, ast.Constant)]
            named = [part.value for part in constants if part.value in METHOD_NAMES]
            assert not named, f"{path.name}:{node.lineno} compares with the method name {named[0]!r}"
        if isinstance(node, ast.Dict):
            keys = [key.value for key in node.keys if isinstance(key, ast.Constant) and key.value in METHOD_NAMES]
            assert not keys, f"{path.name}:{node.lineno} keys a dictionary by the method name {keys[0]!r}"
