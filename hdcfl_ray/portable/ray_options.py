"""Ray options that start an actor's or task's worker process with the portable
environment: Ray sets a runtime_env's env_vars before the worker's Python starts,
on whichever node it lands, so the libraries load pinned (a worker whose node was
started without the pins included). Workers with their own runtime_env are not
shared with other jobs' workers."""

from __future__ import annotations

from typing import Any

from hdcfl_ray.portable.environment import portable_environment


def with_portable_environment(options: dict[str, Any], portable: bool) -> dict[str, Any]:
    """`options` (for `.options()` or `ray.remote`), their runtime_env's env_vars
    extended with the pins when `portable`; unchanged otherwise."""
    if not portable:
        return options
    runtime_env = dict(options.get("runtime_env") or {})
    runtime_env["env_vars"] = {**(runtime_env.get("env_vars") or {}), **portable_environment()}
    return {**options, "runtime_env": runtime_env}
