"""Stopping a run with SIGINT (Ctrl-C) or SIGTERM, at any moment, so that it leaves a
resumable run folder and no process behind.

While `stop_signals()` is active, the first SIGINT or SIGTERM raises `RunInterrupted`
(a KeyboardInterrupt) in the main thread; the run unwinds through its normal
clean-up (the manifest is marked `interrupted`, the backend closed, a private Ray
shut down), and the command exits 128 + the signal's number (130, 143). Further
signals while that clean-up runs are noted and ignored: a second Ctrl-C must not cut
Ray's shutdown short and leave its agents running.

Ray's `ray.init` installs SIGTERM handlers of its own (one exits with the signal
number at once, one kills the node's processes and exits 1); `ray_keeps_our_handlers`
keeps ours in place while Ray starts. A signal that arrives while Ray starts may be
swallowed by code that catches every exception; `raise_if_received` raises it again
at the next safe point (after the start, before each round).
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class RunInterrupted(KeyboardInterrupt):
    """The run was asked to stop by a signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


_state: dict[str, Any] = {"active": False, "signum": None}


def _on_signal(signum: int, frame: Any) -> None:
    if _state["signum"] is not None:
        return  # the clean-up of the first one is under way: let it finish
    _state["signum"] = signum
    raise RunInterrupted(signum)


def _install() -> None:
    for signum in STOP_SIGNALS:
        signal.signal(signum, _on_signal)


@contextmanager
def stop_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise RunInterrupted inside this block (main thread only)."""
    if threading.current_thread() is not threading.main_thread() or _state["active"]:
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    _state.update(active=True, signum=None)
    _install()
    try:
        yield
    finally:
        _state["active"] = False
        stopped = _state["signum"] is not None
        for signum, handler in previous.items():
            # once stopped, later signals are ignored until the process has exited
            signal.signal(signum, signal.SIG_IGN if stopped else handler)


def received() -> int | None:
    """The signal that stopped the run, if one did."""
    return _state["signum"]


def raise_if_received() -> None:
    """Raise RunInterrupted when a stop signal arrived but its exception was swallowed."""
    if _state["active"] and _state["signum"] is not None:
        raise RunInterrupted(_state["signum"])


@contextmanager
def ray_keeps_our_handlers() -> Iterator[None]:
    """Around `ray.init`: Ray's own SIGTERM handlers are not installed while
    stop_signals() is active (ours would be replaced by one that exits at once)."""
    if not _state["active"] or threading.current_thread() is not threading.main_thread():
        yield
        return
    import ray._private.utils as ray_utils

    original = ray_utils.set_sigterm_handler
    ray_utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        ray_utils.set_sigterm_handler = original
        _install()
    raise_if_received()
