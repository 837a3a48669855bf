"""The methods there are: every module in this package that declares
`METHOD = MethodSpec(...)`, found by name, and those of plugins (installed
packages' `hdcfl_ray.methods` entry points, modules named with --plugin;
hdcfl_ray.plugins). The scenario schema's `algorithm` section, the names error
messages offer and the asynchronous check are all built from these declarations,
so a new method is its module and its test."""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from hdcfl_ray.contract import ASYNC_HOOKS, AUTO, NEWCOMER_HOOKS, Method, MethodSpec, RunInfo, Section


def method_specs() -> dict[str, MethodSpec]:
    """Every method, built-in and plugin, by name, in name order."""
    from hdcfl_ray.plugins import merged

    return merged("methods", builtin_method_specs())


@cache
def builtin_method_specs() -> dict[str, MethodSpec]:
    """Every method declared in this package by name, in name order."""
    import hdcfl_ray.algorithms as package

    specs: dict[str, MethodSpec] = {}
    owners: dict[str, str] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda info: info.name):
        if info.name == "registry":
            continue
        module_name = f"{package.__name__}.{info.name}"
        spec = getattr(importlib.import_module(module_name), "METHOD", None)
        if spec is None:
            continue  # a method's maths, not a method
        if not isinstance(spec, MethodSpec):
            raise TypeError(f"{module_name}.METHOD must be a MethodSpec, got {type(spec).__name__}")
        if spec.name in specs:
            raise ValueError(f"method name {spec.name!r} is declared by both {owners[spec.name]} and {module_name}")
        specs[spec.name] = spec
        owners[spec.name] = module_name
    return dict(sorted(specs.items()))


def method_names() -> tuple[str, ...]:
    return tuple(method_specs())


def method_spec(name: str) -> MethodSpec:
    specs = method_specs()
    if name not in specs:
        raise ValueError(f"algorithm.name: {name!r} is not a method; choose from {', '.join(specs)}")
    return specs[name]


def supports_async(name: str) -> bool:
    """Whether the method declares that it runs in `protocol.mode: async`."""
    return method_spec(name).asynchronous


def build_method(name: str, params: Section | None, run: RunInfo) -> Method:
    """The method `name` built from its parameters (its `algorithm.<name>` section)."""
    spec = method_spec(name)
    params = params if params is not None else spec.params()
    # a knob set to auto has no value until a run chooses one (hdcfl_ray/auto_knobs)
    unchosen = [knob.key for knob in spec.auto_knobs if getattr(params, knob.key) == AUTO]
    if unchosen:
        raise ValueError(
            f"{', '.join(f'algorithm.{name}.{key}' for key in unchosen)}: auto is chosen when a run starts "
            "(hdcfl-ray simulate, hdcfl_ray.simulate, sweeps); give a value to build the method outside a run"
        )
    method = spec.build(params, run)
    if spec.asynchronous:
        missing = [hook for hook in ASYNC_HOOKS if not callable(getattr(method, hook, None))]
        if missing:
            raise TypeError(f"method {name!r} declares asynchronous=True but lacks {', '.join(missing)}")
    if spec.newcomer_rule is not None:
        missing = [hook for hook in NEWCOMER_HOOKS if not callable(getattr(method, hook, None))]
        if missing:
            raise TypeError(f"method {name!r} declares a newcomer_rule but lacks {', '.join(missing)}")
    return method


def newcomer_rule(name: str) -> str | None:
    """What the method scores a newcomer with (its declaration's line), or None."""
    return method_spec(name).newcomer_rule
