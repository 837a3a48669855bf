"""Plugins on Ray's workers.

A Ray worker imports what it unpickles (a plugin's method, its parameters, the
scenario's plugin sections) and looks plugins up by name in its own registries (a
plugin encoder, partition or transform). So every worker of a run needs each plugin's
code on its path and the plugin modules named in HDCFL_RAY_PLUGINS. A private Ray
instance's workers inherit the variable from the driver, but a cluster's do not, and
no worker sees a module that is on the driver's path only (a folder given to
PYTHONPATH or sys.path on one machine).

Both travel in Ray's runtime_env. `ray_runtime_env()`, for the `ray.init` that starts
or joins Ray, uploads the code of every plugin module that is not installed (found
outside site-packages: a file or folder of the user's, an editable install) as
`py_modules`, and sets the variable; `actor_options()` sets the variable again on each
actor and task, for a Ray that someone else started (its `ray.init` decides what code
its workers have: pass it `runtime_env=ray_runtime_env()`). A plugin installed as a
package must be installed on every node, as hdcfl-ray itself is. Nothing here imports
code a scenario names: only the modules named with --plugin (or `plugins=`) and the
installed entry points, as everywhere.
"""

from __future__ import annotations

import importlib.util
import site
import sysconfig
from functools import cache
from pathlib import Path
from typing import Any

from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.plugins import ENV_VAR, KINDS, named_modules, plugin_specs

# Every worker has hdcfl-ray itself: never shipped, even from a source checkout.
_OWN_PACKAGE = "hdcfl_ray"


def worker_modules() -> tuple[str, ...]:
    """The plugin modules a worker must load by name: those named with --plugin, and
    the entry points' modules this process has from outside site-packages (their
    code is shipped, and a worker without their package installed could not find
    them through entry points)."""
    shipped_entry_points = [module for module in _entry_point_modules() if _code_to_ship(module) is not None]
    return tuple(dict.fromkeys((*named_modules(), *shipped_entry_points)))


def shipped_code() -> list[str]:
    """Paths to upload to every worker: the top-level package folder (or the single
    file) of each plugin module that is not installed, once each."""
    paths = [_code_to_ship(module) for module in worker_modules()]
    return list(dict.fromkeys(str(path) for path in paths if path is not None))


def ray_runtime_env() -> dict[str, Any]:
    """The runtime_env for `ray.init` that gives every worker the plugins this process
    loaded ({} without plugins: the job's workers are then started as before)."""
    modules = worker_modules()
    if not modules:
        return {}
    environment: dict[str, Any] = {"env_vars": {ENV_VAR: ",".join(modules)}}
    code = shipped_code()
    if code:
        environment["py_modules"] = code
    return environment


def actor_options() -> dict[str, Any]:
    """Options for each actor and task of a run: the plugin variable, merged by Ray into
    the job's runtime_env (so a job's shipped code stays); {} without plugins."""
    modules = worker_modules()
    return {"runtime_env": {"env_vars": {ENV_VAR: ",".join(modules)}}} if modules else {}


def _entry_point_modules() -> list[str]:
    return [origin.module for kind in KINDS for _, origin in plugin_specs(kind).values() if origin.via == "entry point"]


def _code_to_ship(module: str) -> Path | None:
    """The file or top-level package folder that holds `module`, when it is not
    installed (None for an installed one, hdcfl-ray and the standard library)."""
    top = module.split(".")[0]
    if top == _OWN_PACKAGE:
        return None
    spec = importlib.util.find_spec(top)
    if spec is None:  # the driver imported it already, so this only happens to odd loaders
        raise ScenarioError(f"plugin {module}: Ray's workers cannot be given it (no file found for {top})")
    locations = list(spec.submodule_search_locations or [])
    if len(locations) > 1:
        raise ScenarioError(
            f"plugin {module}: {top} is a namespace package spread over {len(locations)} folders, which cannot be "
            "shipped to Ray's workers; install it on every node instead"
        )
    if locations:
        path = Path(locations[0])
    elif spec.origin and spec.has_location:
        path = Path(spec.origin)
    else:
        return None  # built in or frozen: every interpreter has it
    return None if _installed(path) else path


def _installed(path: Path) -> bool:
    resolved = path.resolve()
    return any(resolved.is_relative_to(root) for root in _installed_roots())


@cache
def _installed_roots() -> tuple[Path, ...]:
    """Where installed code lives: site-packages folders and the standard library."""
    folders = [*site.getsitepackages(), site.getusersitepackages()]
    folders += [sysconfig.get_paths()[name] for name in ("purelib", "platlib", "stdlib", "platstdlib")]
    return tuple(dict.fromkeys(Path(folder).resolve() for folder in folders if folder))
