"""Plugins: methods, partitions, data sources, client transforms and encoders that
live outside this package.

An installed package declares them as entry points, one group per kind:

    [project.entry-points."hdcfl_ray.methods"]
    my_method = "my_package.my_method"          # a module with METHOD = MethodSpec(...)
    [project.entry-points."hdcfl_ray.partitions"]
    my_split = "my_package.splits:PARTITION"    # or the spec object itself

A module may also be named on the command line (`--plugin MODULE`), in the API
(`plugins=[...]`) or in HDCFL_RAY_PLUGINS (comma-separated; set by both, so that
Ray's worker processes load the same modules). A scenario file never names code:
nothing is imported because of a key in it.

A module declares its specs at module level as METHOD / PARTITION / SOURCE /
TRANSFORM / ENCODER (or a list or tuple in METHODS, PARTITIONS, ...). Each spec
is recorded with the package (and version) it came from, for the manifest."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from types import ModuleType
from typing import Any, Iterable

from hdcfl_ray.contract.data import EncoderSpec, PartitionSpec, SourceSpec, TransformSpec
from hdcfl_ray.contract.method import MethodSpec
from hdcfl_ray.errors import ScenarioError

ENV_VAR = "HDCFL_RAY_PLUGINS"

KINDS: dict[str, tuple[str, type, str]] = {
    # kind: (entry point group, spec type, module attribute)
    "methods": ("hdcfl_ray.methods", MethodSpec, "METHOD"),
    "partitions": ("hdcfl_ray.partitions", PartitionSpec, "PARTITION"),
    "sources": ("hdcfl_ray.sources", SourceSpec, "SOURCE"),
    "transforms": ("hdcfl_ray.transforms", TransformSpec, "TRANSFORM"),
    "encoders": ("hdcfl_ray.encoders", EncoderSpec, "ENCODER"),
}


@dataclass(frozen=True)
class Origin:
    """Where a plugin spec came from: its distribution (and version) when installed,
    else the module that was named."""

    package: str
    version: str | None
    module: str
    via: str  # "entry point" or "module"

    def as_dict(self) -> dict[str, Any]:
        return {"package": self.package, "version": self.version, "module": self.module, "via": self.via}


def named_modules() -> tuple[str, ...]:
    """The modules named with --plugin, in the API or in HDCFL_RAY_PLUGINS."""
    names = [name.strip() for name in os.environ.get(ENV_VAR, "").split(",")]
    return tuple(dict.fromkeys(name for name in names if name))


def load_plugins(modules: Iterable[str]) -> None:
    """Import the named modules now (an error names the module), add them to
    HDCFL_RAY_PLUGINS so that worker processes load them too, and rebuild every
    registry."""
    modules = [str(module).strip() for module in modules if str(module).strip()]
    if not modules:
        return
    for module in modules:
        _import(module, "--plugin")
    combined = dict.fromkeys((*named_modules(), *modules))
    if combined:
        os.environ[ENV_VAR] = ",".join(combined)
    clear_caches()


def clear_caches() -> None:
    plugin_specs.cache_clear()


def _import(module: str, where: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ScenarioError(f"{where} {module}: cannot import it ({error}); is its package installed or on PYTHONPATH?") from error


@cache
def _distributions_by_top_level_module() -> dict[str, list[str]]:
    """Which installed distributions provide each top-level module. Reading it scans every
    installed package's file list (0.3 s alone here, with the trackers and Ray installed),
    so it is read once per process: what is installed does not change under a run."""
    try:
        return dict(metadata.packages_distributions())
    except Exception:  # a broken metadata entry must not stop a run
        return {}


def _distribution_of(module: str) -> tuple[str, str | None]:
    top = module.split(".")[0]
    distributions = _distributions_by_top_level_module().get(top, [])
    if distributions:
        name = distributions[0]
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            return name, None
    version = getattr(importlib.import_module(top), "__version__", None)
    return top, None if version is None else str(version)


def _specs_in(value: Any, kind: str, where: str) -> list[Any]:
    spec_type, attribute = KINDS[kind][1], KINDS[kind][2]
    if isinstance(value, ModuleType):
        found: list[Any] = []
        if hasattr(value, attribute):
            found.append(getattr(value, attribute))
        found += list(getattr(value, attribute + "S", ()))
        values = found
    elif isinstance(value, (list, tuple)):
        values = list(value)
    else:
        values = [value]
    for spec in values:
        if not isinstance(spec, spec_type):
            raise TypeError(f"{where}: expected a {spec_type.__name__}, got {type(spec).__name__}")
    return values


@cache
def plugin_specs(kind: str) -> dict[str, tuple[Any, Origin]]:
    """Every plugin spec of `kind` by name: entry points first, then named modules."""
    group, _, _ = KINDS[kind]
    found: dict[str, tuple[Any, Origin]] = {}

    def add(spec: Any, origin: Origin) -> None:
        if spec.name in found and found[spec.name][1].module != origin.module:
            raise ValueError(
                f"{kind[:-1]} {spec.name!r} is declared by both {found[spec.name][1].module} and {origin.module}"
            )
        found[spec.name] = (spec, origin)

    for entry in sorted(metadata.entry_points(group=group), key=lambda entry: entry.name):
        where = f"entry point {entry.name} = {entry.value} ({group})"
        for spec in _specs_in(entry.load(), kind, where):
            dist = getattr(entry, "dist", None)
            package = dist.metadata["Name"] if dist is not None else entry.module.split(".")[0]
            version = dist.version if dist is not None else None
            add(spec, Origin(package, version, entry.module, "entry point"))
    for module in named_modules():
        loaded = _import(module, ENV_VAR)
        package, version = _distribution_of(module)
        for spec in _specs_in(loaded, kind, f"plugin module {module}"):
            add(spec, Origin(package, version, module, "module"))
    return dict(sorted(found.items()))


def merged(kind: str, builtins: dict[str, Any]) -> dict[str, Any]:
    """The built-in specs of `kind` and the plugins' together, by name; a plugin may
    not take a built-in's name."""
    specs = dict(builtins)
    for name, (spec, origin) in plugin_specs(kind).items():
        if name in specs:
            raise ValueError(f"{kind[:-1]} {name!r} from {origin.module} has the name of a built-in one")
        specs[name] = spec
    return dict(sorted(specs.items()))

