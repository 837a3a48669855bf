"""Sweeps: a grid of scenarios x algorithms x seeds, run (concurrently when the
cluster allows), indexed, and resumable.

`hdcfl_ray.sweep(...)` calls `hdcfl_ray.api.sweep`: this package is callable, so the
name works whether or not its modules were imported (an import of
`hdcfl_ray.sweep.grid` makes the package the value of `hdcfl_ray.sweep`)."""

from __future__ import annotations

import sys
import types
from typing import Any


class _CallableSweepPackage(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from hdcfl_ray.api import sweep

        return sweep(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableSweepPackage
