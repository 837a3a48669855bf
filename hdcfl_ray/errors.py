"""Errors a user can cause (the CLI maps ScenarioError to exit code 2), the error
that names a failing client, and the plain text run records and the terminal show of
an error: its first line, and where it happened."""

from __future__ import annotations

import sys
import traceback

from hdcfl_ray.plain_text import plain_text


class ScenarioError(Exception):
    """Bad input: a scenario key, an override, a missing data file. The message
    names where the problem is and what to do."""


class RayStartFailed(RuntimeError):
    """The private Ray instance a run or sweep starts did not come up (its node timed out,
    a port or the memory it needs was taken): the CLI says so in one line, exit code 1,
    with what usually causes it, instead of Ray's traceback."""


class ClientUpdateFailed(RuntimeError):
    """A client's local update raised (or the batched training of several clients
    together): names the clients and the round, with the original error as its
    cause. It crosses Ray's process boundary intact (it pickles the arguments it is
    built from)."""

    def __init__(self, client_ids: tuple[int, ...], round_index: int, reason: str) -> None:
        who = f"client {client_ids[0]}" if len(client_ids) == 1 else f"clients {', '.join(map(str, client_ids))} (training together)"
        super().__init__(f"{who} failed in round {round_index}: {reason}")
        self.client_ids = tuple(client_ids)
        self.round_index = round_index
        # not `cause`: Ray's wrapper of an error raised on a worker keeps the original
        # under that name, and reads the wrapped error's other attributes through it
        self.reason = reason

    def __reduce__(self) -> tuple[type, tuple[tuple[int, ...], int, str]]:
        return (type(self), (self.client_ids, self.round_index, self.reason))


def _is_ray_task_error(error: BaseException) -> bool:
    # Ray is not imported to ask: a process that never imported it received no Ray error
    exceptions = sys.modules.get("ray.exceptions")
    return exceptions is not None and isinstance(error, exceptions.RayTaskError)


def _unwrapped(error: BaseException) -> tuple[BaseException, BaseException | None]:
    """(the error as it was raised, the innermost of Ray's wrappers around it or None).
    Ray raises a worker's error in the driver wrapped in a RayTaskError (one more for
    each actor it passed through) whose text is the whole remote traceback, in colour,
    with the message at its very end; the wrapper keeps the original as `cause`."""
    wrapper = None
    while _is_ray_task_error(error):
        inner = getattr(error, "cause", None)
        if not isinstance(inner, BaseException) or inner is error:
            break
        wrapper, error = error, inner
    return error, wrapper


def failure_text(error: BaseException) -> str:
    """`Type: message` of an error as it was raised, Ray's wrappers taken off (so a
    client failing on a Ray host reads as it does on the local backend), as plain
    text: what run records store and the first line the terminal shows."""
    raised = _unwrapped(error)[0]
    return plain_text(f"{type(raised).__name__}: {raised}")


def failure_traceback(error: BaseException) -> str:
    """Where a failure happened, as plain text to show after its first line: the
    traceback Ray sent from the worker, or that of a client's own error raised in
    this process; '' for any other error (a local failure of the run itself says
    what it needs in its first line)."""
    wrapper = _unwrapped(error)[1]
    if wrapper is not None:  # the innermost wrapper's text is the worker's traceback
        return plain_text(str(wrapper)).strip("\n")
    if isinstance(error, ClientUpdateFailed) and error.__cause__ is not None:
        return plain_text("".join(traceback.format_exception(error.__cause__))).strip("\n")
    return ""
