"""No tensor is born on the wrong device: in the modules that run on a client host
(its runtime, the training loops, the methods, the models), every torch constructor names its device.

A constructor without `device=` makes a CPU tensor; on a CUDA host that is either
a crash when it meets a GPU tensor or a silent host-device copy every call. The
CPU machine running this suite cannot see either, so the rule is checked on the
source. The allowlist holds the constructors that are meant for the CPU."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hdcfl_ray"
CLIENT_SIDE = [PACKAGE / "runtime" / "client", PACKAGE / "training", PACKAGE / "algorithms", PACKAGE / "models"]
CONSTRUCTORS = {"tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "linspace", "eye", "rand", "randn", "randint", "randperm"}
# (module relative to hdcfl_ray, enclosing function, constructor): why it is meant for the CPU
ALLOWED = {
    ("training/local_training.py", "train_locally", "randperm"): "the batch order comes from the CPU generator (device-independent bits); moved to the device at once",
    ("runtime/client/batched_training.py", "__init__", "randperm"): "every epoch's batch order up front, as train_locally draws them, from the client's CPU generator; moved to the device in the plan's one transfer",
    ("runtime/client/batched_training.py", "__init__", "as_tensor"): "the clients of each step group, built on the host with the orders and moved in the same one transfer",
}


def _unplaced_constructors(path: Path) -> list[tuple[str, str, str, int]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    relative = path.relative_to(PACKAGE).as_posix()
    found = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if (
                isinstance(child, ast.Call)
                and isinstance(child.func, ast.Attribute)
                and isinstance(child.func.value, ast.Name)
                and child.func.value.id == "torch"
                and child.func.attr in CONSTRUCTORS
                and not any(keyword.arg == "device" for keyword in child.keywords)
            ):
                found.append((relative, function, child.func.attr, child.lineno))
            visit(child, name)

    visit(tree, "<module>")
    return found


def test_client_side_constructors_name_their_device() -> None:
    unplaced = [hit for folder in CLIENT_SIDE for path in sorted(folder.rglob("*.py")) for hit in _unplaced_constructors(path)]
    offending = [f"{module}:{line} {function}: torch.{name}(...) without device=" for module, function, name, line in unplaced if (module, function, name) not in ALLOWED]
    assert not offending, "\n".join(offending)


def test_the_scan_sees_a_constructor_without_a_device(tmp_path: Path) -> None:
    sample = PACKAGE / "runtime" / "client" / "_scan_sample.py"
    try:
        sample.write_text("import torch\n\ndef f(x):\n    return torch.zeros(3), torch.ones(2, device=x.device)\n")
        assert _unplaced_constructors(sample) == [("runtime/client/_scan_sample.py", "f", "zeros", 4)]
    finally:
        sample.unlink()


def test_every_allowlist_entry_still_exists() -> None:
    unplaced = {(module, function, name) for folder in CLIENT_SIDE for path in sorted(folder.rglob("*.py")) for module, function, name, _ in _unplaced_constructors(path)}
    assert set(ALLOWED) <= unplaced, f"stale allowlist entries: {set(ALLOWED) - unplaced}"
