"""Portable CPU arithmetic (`runtime.portable: true`): every process that trains or
scores computes with the same instruction-set paths of its math libraries, so runs
on different x86-64 CPUs give the same bits.

* `environment`: the pins (environment variables the libraries read when they load)
  and why each is there;
* `machine`: what the CPU offers and what this process computes with, for the
  manifest and for the checks;
* `process`: whether this process is pinned, and the refusal when it is not;
* `restart`: the `hdcfl-ray` command restarting itself with the pins.

docs/same-results.md has the measurements behind the choice.
"""

from hdcfl_ray.portable.environment import PORTABLE_LEVEL, portable_environment
from hdcfl_ray.portable.process import require_pinned_process

__all__ = ["PORTABLE_LEVEL", "portable_environment", "require_pinned_process"]
