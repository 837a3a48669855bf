"""How many of a clustered run's groups never held a client at any evaluation.

A method that ends with one group may have trained two and merged them late, or have
left one untouched from the start (FedCE's second component on the Shakespeare
stand-in: its share fell below the training floor at the first E-step and no client
trained it again). The final grouping cannot tell them apart; the whole run's
evaluations can. A group held a client at an evaluation when it was the client's
assigned group (argmax membership for soft methods) or carried more than HELD_SHARE
of its membership.
"""

from __future__ import annotations

import math

from analysis.runs import RunRecord

# a membership above this share counts as the group holding the client
HELD_SHARE = 0.01


def groups_never_held(run: RunRecord, groups_asked: float) -> tuple[float, float]:
    """(groups that never held a client at any evaluated round, groups the run had): the
    group count is the length of the logged memberships, else `groups_asked` for a method
    that logs hard groups only; (NaN, NaN) where the run logs neither or the count is unknown."""
    columns = run.clients.column_names
    memberships = run.clients.column("memberships").to_pylist() if "memberships" in columns else []
    groups = run.clients.column("group").to_pylist() if "group" in columns else []
    soft = [row for row in memberships if row and len(row) >= 2]
    count = max((len(row) for row in soft), default=0) or groups_asked
    if not (soft or any(g is not None for g in groups)) or math.isnan(count) or count < 2:
        return math.nan, math.nan
    held = {int(g) for g in groups if g is not None}
    for row in soft:
        held.update(k for k, share in enumerate(row) if share is not None and share > HELD_SHARE)
    return float(sum(1 for k in range(int(count)) if k not in held)), float(count)
