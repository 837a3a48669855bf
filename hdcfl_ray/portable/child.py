"""A portable run asked for from a Python session that was not started pinned (a
notebook, a script): the math libraries of this process fixed their instruction sets
when they loaded, so the run goes to a fresh Python process started with the portable
environment, running the `hdcfl-ray` command, and this process reads its run folder.

The child's output is passed on line by line (its live view prints plainly without a
terminal); exit 2 becomes the ScenarioError the command printed, any other failure a
RuntimeError with the command's last lines; an interrupt here stops the child the way
Ctrl-C stops the command, resumably."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import deque
from typing import Callable, Sequence

from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.portable.environment import portable_environment
from hdcfl_ray.portable.restart import RESTARTED

EXIT_BAD_INPUT = 2
_TAIL_LINES = 40


def pinned_child_environment() -> dict[str, str]:
    """This process's environment with the portable pins, and its import path (so
    plugin modules it loaded from a folder of the user's are found there too)."""
    environment = dict(os.environ)
    pins = portable_environment()
    replaced = {name: environment[name] for name in pins if name in environment and environment[name] != pins[name]}
    environment.update(pins)
    environment[RESTARTED] = json.dumps(replaced)
    paths = [entry for entry in sys.path if entry and os.path.isdir(entry)]
    if environment.get("PYTHONPATH"):
        paths.append(environment["PYTHONPATH"])
    environment["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return environment


def run_command_pinned(arguments: Sequence[str], echo: Callable[[str], None] | None) -> None:
    """`hdcfl-ray ARGUMENTS` in a fresh process started with the portable environment,
    in this working directory; returns when it exits 0."""
    command = [sys.executable, "-m", "cli", *arguments]
    tail: deque[str] = deque(maxlen=_TAIL_LINES)
    child = subprocess.Popen(
        command, env=pinned_child_environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    try:
        assert child.stdout is not None
        for line in child.stdout:
            tail.append(line.rstrip("\n"))
            if echo is not None:
                echo(line.rstrip("\n"))
        code = child.wait()
    except BaseException:  # Ctrl-C in the notebook: stop the run as Ctrl-C stops the command (resumably)
        child.send_signal(signal.SIGINT)
        try:
            child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        raise
    if code == 0:
        return
    text = "\n".join(tail)
    if code == EXIT_BAD_INPUT:
        message = text.split("error:", 1)[1].strip() if "error:" in text else text
        raise ScenarioError(message)
    raise RuntimeError(f"the portable run's process (hdcfl-ray {' '.join(arguments)}) exited {code}:\n{text}")
