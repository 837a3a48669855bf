"""The code's layers: the method contract imports neither torch nor Ray, nothing
imports in a circle, and every method types its hooks and declares itself."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

from hdcfl_ray.algorithms.registry import build_method, method_names, method_specs
from hdcfl_ray.auto_knobs.plan import stand_in_values
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.contract import ASYNC_HOOKS, RunInfo
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.runtime.preflight import prepare_run
from tests.conftest import tiny_scenario

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hdcfl_ray"
PRODUCT = (PACKAGE, ROOT / "analysis")  # installed product code: the package and the report's analysis

# The floors, ground first (docs/layout.md): a module imports only from its own floor and
# the ones below. A prefix names a package or module; the longest prefix that matches a
# module places it, so a package can keep its lower modules on a lower floor.
LAYERS: list[tuple[str, ...]] = [
    # values, errors and maths with no project dependency: what everything may use
    ("hdcfl_ray.errors", "hdcfl_ray.plain_text", "hdcfl_ray.durable_files", "hdcfl_ray.seeding", "hdcfl_ray.host_memory", "hdcfl_ray.user_cache", "hdcfl_ray.id_ranges", "hdcfl_ray.contract",
     "hdcfl_ray.maths", "hdcfl_ray.privacy", "hdcfl_ray.diagnostics"),
    # HDC-FL's maths, the plugin registry, torch-only training pieces the methods use
    ("hdcfl_ray.plugins", "hdcfl_ray.hdcfl", "hdcfl_ray.training.tally", "hdcfl_ray.training.precision", "hdcfl_ray.training.scores"),
    ("hdcfl_ray.algorithms",),  # the methods
    ("hdcfl_ray.config", "hdcfl_ray.data"),  # the scenario schema (it knows the methods' sections) and the data
    ("hdcfl_ray.models", "hdcfl_ray.training", "hdcfl_ray.portable", "hdcfl_ray.plugin_shipping"),
    # storage formats and what a run records; the plan of auto knobs (pure: no run)
    ("hdcfl_ray.logs", "hdcfl_ray.checkpoint", "hdcfl_ray.trackers", "hdcfl_ray.auto_knobs.plan", "hdcfl_ray.auto_knobs.record",
     "hdcfl_ray.auto_knobs.selection", "hdcfl_ray.auto_knobs.digests"),
    ("hdcfl_ray.runtime",),  # preflight, client hosts, the server, backends
    ("hdcfl_ray.ablation", "hdcfl_ray.terminal"),  # replays of saved refreshes; the terminal views
    ("hdcfl_ray.auto_knobs",),  # choosing auto knobs (candidate runs passed in, replays)
    ("hdcfl_ray.runtime.driver", "hdcfl_ray.pretraining"),  # a whole run; the pretrain command
    ("hdcfl_ray.sweeps", "hdcfl_ray.plugin_listing"),
    ("analysis",),  # reading run folders: the report's tables and figures
    ("hdcfl_ray.api", "hdcfl_ray"),  # the Python API the CLI is a thin layer over
]
# Imports that run up a floor, each with its reason (at most five)
ALLOWED_UP = {
    ("hdcfl_ray.contract.context", "hdcfl_ray.models.flat"): "a type annotation only (TYPE_CHECKING): the context hands methods flat-index views",
}


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(roots: tuple[Path, ...] = (PACKAGE,)) -> nx.DiGraph:
    """Every import between product modules: module level, inside functions and under TYPE_CHECKING."""
    modules = {module_name(path, root): path for root in roots for path in root.rglob("*.py")}
    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
            graph.add_edges_from((name, target) for target in targets if target in modules and target != name)
    return graph


def floor(module: str) -> int | None:
    matches = [(len(prefix), index) for index, prefixes in enumerate(LAYERS) for prefix in prefixes
               if module == prefix or module.startswith(prefix + ".")]  # fmt: skip
    return max(matches)[1] if matches else None


def upward_imports(graph: nx.DiGraph) -> list[tuple[str, str]]:
    return sorted((a, b) for a, b in graph.edges if floor(a) is not None and floor(b) is not None and floor(b) > floor(a))


def test_every_product_module_has_a_floor() -> None:
    assert [name for name in import_graph(PRODUCT) if floor(name) is None] == []


def test_imports_point_down_the_floors_but_for_the_named_exceptions() -> None:
    up = upward_imports(import_graph(PRODUCT))
    unexplained = [f"{a} -> {b} (floor {floor(a)} imports floor {floor(b)})" for a, b in up if (a, b) not in ALLOWED_UP]
    assert unexplained == [], "an import runs up the floors (docs/layout.md says where a new concern goes):\n" + "\n".join(unexplained)
    assert len(ALLOWED_UP) <= 5 and set(ALLOWED_UP) <= set(up), "an allowed exception no longer exists: remove it"


def test_the_floor_check_catches_an_import_that_runs_up() -> None:
    graph = nx.DiGraph([("hdcfl_ray.logs.manifest", "hdcfl_ray.runtime.driver"), ("hdcfl_ray.runtime.driver", "hdcfl_ray.logs.manifest")])
    assert upward_imports(graph) == [("hdcfl_ray.logs.manifest", "hdcfl_ray.runtime.driver")]


def test_no_product_module_imports_in_a_circle() -> None:
    cycles = [" -> ".join(cycle) for cycle in nx.simple_cycles(import_graph(PRODUCT))]
    assert cycles == []


def test_the_contract_imports_only_itself_and_its_section_base() -> None:
    graph = import_graph()
    contract = [name for name in graph if name.startswith("hdcfl_ray.contract")]
    outside = {target for name in contract for target in graph.successors(name) if not target.startswith("hdcfl_ray.contract")}
    assert outside <= {"hdcfl_ray.models.flat"}  # an annotation only (TYPE_CHECKING)


def test_importing_the_contract_and_every_method_loads_neither_torch_nor_ray() -> None:
    probe = "import sys, hdcfl_ray.contract, hdcfl_ray.algorithms.registry as r; r.method_specs(); print(sorted({'torch', 'ray'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_no_method_hook_takes_an_untyped_context() -> None:
    untyped = []
    for path in (PACKAGE / "algorithms").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for argument in node.args.args:
                    if argument.arg == "ctx" and (argument.annotation is None or ast.unparse(argument.annotation) in {"Any", "'Any'"}):
                        untyped.append(f"{path.name}:{node.name}")
    assert untyped == []


def test_every_method_declares_a_described_parameter_section() -> None:
    for name, spec in method_specs().items():
        assert spec.summary, name
        undescribed = [key for key, field in spec.params.model_fields.items() if not (field.description or "").strip()]
        assert undescribed == [], f"{name}: describe {undescribed}"


def test_a_method_declared_asynchronous_has_every_async_hook() -> None:
    for name, spec in method_specs().items():
        params = spec.params()  # its auto knobs at a value they may take: a run chooses them
        method = build_method(name, params.model_copy(update=stand_in_values(spec, params)), RunInfo(seed=0, rounds=2))
        has_hooks = all(callable(getattr(method, hook, None)) for hook in ASYNC_HOOKS)
        assert has_hooks or not spec.asynchronous, name


def test_async_mode_is_refused_for_a_method_that_does_not_declare_it() -> None:
    """Inherited hooks do not make a method asynchronous: only its declaration does."""
    synchronous = [name for name, spec in method_specs().items() if not spec.asynchronous]
    scenario = build_scenario(tiny_scenario(algorithm={"name": synchronous[0]}, protocol={"mode": "async"}))
    with pytest.raises(ScenarioError, match="works with .*synchronous rounds only"):
        prepare_run(scenario)


def test_an_unknown_method_name_lists_every_method() -> None:
    with pytest.raises(ScenarioError) as error:
        build_scenario(tiny_scenario(algorithm={"name": "nosuch"}))
    for name in method_names():
        assert f"'{name}'" in str(error.value)
