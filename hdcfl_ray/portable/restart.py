"""The `hdcfl-ray` command restarting itself with the portable environment, before it
loads any data or computes anything, when a scenario it runs asks for portable
arithmetic and the command was started without the pins."""

from __future__ import annotations

import json
import os
import sys
from typing import Iterable

from hdcfl_ray.config.schema import Scenario
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.portable.environment import portable_environment
from hdcfl_ray.portable.process import machine_problem, require_pinned_process, unpinned_libraries

# set in the restarted process, holding the values the pins replaced (JSON): the
# manifest records them, and a process that still is not pinned never restarts twice
RESTARTED = "HDCFL_RAY_PORTABLE_REPLACED"


def replaced_values() -> dict[str, str]:
    """The user's own values of the pinned variables, which the restart replaced."""
    try:
        replaced = json.loads(os.environ.get(RESTARTED) or "{}")
    except json.JSONDecodeError:
        return {}
    return {str(key): str(value) for key, value in replaced.items()} if isinstance(replaced, dict) else {}


def uniform_portable(scenarios: Iterable[Scenario], what: str) -> bool:
    """Whether the runs ask for portable arithmetic; all of them or none (they share
    the command's process, whose pins are fixed when it starts)."""
    modes = {scenario.runtime.portable for scenario in scenarios}
    if len(modes) > 1:
        raise ScenarioError(
            f"runtime.portable: {what} mixes portable and default-mode runs, which share one process whose "
            "instruction sets are fixed when it starts; run them as two commands, or set runtime.portable the same "
            "for all (--set runtime.portable=true)"
        )
    return modes == {True}


def restart_pinned_if_needed(scenarios: Iterable[Scenario], what: str = "the command") -> None:
    """Replace this process with the same command started with the portable
    environment when the runs ask for it and the process lacks it; returns only when
    the process may go on (no portable run, or already pinned)."""
    if not uniform_portable(scenarios, what):
        return
    problem = machine_problem()
    if problem is not None:
        raise ScenarioError(problem)
    if not unpinned_libraries():
        return
    if RESTARTED in os.environ:  # restarted once and still not pinned: say why instead of looping
        require_pinned_process("the restarted hdcfl-ray command")
    pins = portable_environment()
    environment = dict(os.environ)
    replaced = {name: environment[name] for name in pins if name in environment and environment[name] != pins[name]}
    environment.update(pins)
    environment[RESTARTED] = json.dumps(replaced)
    sys.stdout.flush()
    sys.stderr.flush()
    # sys.orig_argv is the command as typed (interpreter, its options, the script or -m module, arguments)
    os.execve(sys.executable, sys.orig_argv, environment)
