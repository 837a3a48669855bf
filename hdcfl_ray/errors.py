"""Errors a user can cause (the CLI maps ScenarioError to exit code 2), the error
that names a failing client, and the plain text run records keep of an error."""

from __future__ import annotations

import re


class ScenarioError(Exception):
    """Bad input: a scenario key, an override, a missing data file. The message
    names where the problem is and what to do."""


class ClientUpdateFailed(RuntimeError):
    """A client's local update raised (or the batched training of several clients
    together): names the clients and the round, with the original error as its
    cause. It crosses Ray's process boundary intact (it pickles the arguments it is
    built from)."""

    def __init__(self, client_ids: tuple[int, ...], round_index: int, cause: str) -> None:
        who = f"client {client_ids[0]}" if len(client_ids) == 1 else f"clients {', '.join(map(str, client_ids))} (training together)"
        super().__init__(f"{who} failed in round {round_index}: {cause}")
        self.client_ids = tuple(client_ids)
        self.round_index = round_index
        self.cause = cause

    def __reduce__(self) -> tuple[type, tuple[tuple[int, ...], int, str]]:
        return (type(self), (self.client_ids, self.round_index, self.cause))


# a terminal's escape sequences (colours, cursor moves), as Ray's remote tracebacks carry them
_TERMINAL_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\x1b[@-Z\\-_]")


def failure_text(error: BaseException) -> str:
    """`Type: message` of an error, as run records store it: plain text, without the
    escape sequences a terminal would show as colours."""
    return _TERMINAL_ESCAPES.sub("", f"{type(error).__name__}: {error}")
