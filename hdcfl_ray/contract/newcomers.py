"""What a method adds to score a newcomer: a client that never trained (one of
`partition.newcomers`, held out of every round), placed and scored by the method's
own rule for a client arriving now (docs/newcomers.md).

A method has a rule when its declaration says so (`MethodSpec.newcomer_rule`, one
line saying what a newcomer is scored with); it then implements the two hooks below,
and may add a probe. Inherited hooks do not give a method a rule: only its
declaration does, so a subclass whose rule differs is never scored by its parent's.

At each evaluated round the runtime, for every newcomer:

    server: newcomer_probe_task?  -> client: probe (the method's own probe hook)
    server: newcomer_task (with the probe's answer, or None)
    client: evaluate_newcomer (the newcomer's initial state, `epochs` of budget)

The newcomer's state is the one `init_client` gives it, every time: a newcomer is
scored as if it arrived at that round, and nothing it does is kept. Its work is
counted in its own budget, and the bytes it is sent and sends under a newcomer
label, never in the training traffic."""

from __future__ import annotations

from typing import Any, Mapping, Protocol

from hdcfl_ray.contract.context import ClientContext
from hdcfl_ray.contract.values import ClientTask, EvalResult

# what a newcomer's rows say of a method whose declaration names no rule
NO_NEWCOMER_RULE = "no newcomer rule"

NEWCOMER_HOOKS = ("newcomer_task", "evaluate_newcomer")


class NewcomerHooks(Protocol):
    """The hooks of a method that declares a `newcomer_rule`."""

    # server: the newcomer's evaluation job from the current state; `probe` is the answer
    # to `newcomer_probe_task`'s job (None for a method without one). Must not change `state`.
    def newcomer_task(self, state: Any, round_index: int, client_id: int, probe: Mapping[str, Any] | None) -> ClientTask: ...

    # client: place and score the newcomer, training at most `epochs` epochs on its
    # training data (protocol.newcomer_epochs); `state` is its initial client state
    def evaluate_newcomer(
        self, ctx: ClientContext, state: Any, task: ClientTask, objects: Mapping[str, Any], epochs: int
    ) -> EvalResult: ...


class NewcomerProbe(Protocol):
    """Optional: a job the newcomer answers first through the method's `probe` hook (its
    data subspace, say), whose answer `newcomer_task` reads."""

    def newcomer_probe_task(self, state: Any, round_index: int, client_id: int) -> ClientTask | None: ...


def newcomer_probe_task(method: Any, state: Any, round_index: int, client_id: int) -> ClientTask | None:
    """The method's probe job for a newcomer, or None (a method without the hook)."""
    hook = getattr(method, "newcomer_probe_task", None)
    return None if hook is None else hook(state, round_index, client_id)
