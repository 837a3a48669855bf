"""The clustered table's "never held a client" column (analysis/group_usage.py): a group
that no client was assigned to, or gave more than a sliver of membership, at any
evaluation is counted, so a run that ended with one group says whether the other was
ever in use."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pyarrow as pa

from analysis.group_usage import HELD_SHARE, groups_never_held


def run_with(memberships: list[list[float] | None], groups: list[int | None]) -> SimpleNamespace:
    clients = pa.table({"memberships": pa.array(memberships, pa.list_(pa.float64())), "group": pa.array(groups, pa.int64())})
    return SimpleNamespace(clients=clients)


def test_a_component_under_the_floor_at_every_evaluation_never_held_a_client() -> None:
    rng = random.Random()
    rows = 3 * rng.randrange(2, 20)  # evaluations x clients, any number
    # FedCE's seed-42 run on the Shakespeare stand-in: component 0 at the 1e-4 floor throughout
    memberships = [[1e-4, 1 - 1e-4] for _ in range(rows)]
    assert groups_never_held(run_with(memberships, [1] * rows), math.nan) == (1.0, 2.0)


def test_a_component_that_held_one_client_once_counts_as_used() -> None:
    memberships = [[1e-4, 1 - 1e-4]] * 10 + [[2 * HELD_SHARE, 1 - 2 * HELD_SHARE]]
    assert groups_never_held(run_with(memberships, [1] * 11), math.nan) == (0.0, 2.0)
    # and one that was some client's argmax at some evaluation, whatever its share elsewhere
    assert groups_never_held(run_with([[0.0, 1.0], [0.0, 1.0]], [1, 0]), math.nan) == (0.0, 2.0)


def test_hard_groups_are_counted_against_the_groups_the_method_was_asked_for() -> None:
    asked = random.randrange(3, 12)
    used = sorted(random.sample(range(asked), random.randrange(1, asked)))
    groups = [used[i % len(used)] for i in range(40)]
    assert groups_never_held(run_with([None] * 40, groups), float(asked)) == (float(asked - len(used)), float(asked))


def test_a_run_without_groups_or_a_known_count_has_no_value() -> None:
    assert all(math.isnan(v) for v in groups_never_held(run_with([None] * 4, [None] * 4), 4.0))
    assert all(math.isnan(v) for v in groups_never_held(run_with([None] * 4, [0, 1, 0, 1]), math.nan))  # PACFL: a threshold, no count
    assert all(math.isnan(v) for v in groups_never_held(SimpleNamespace(clients=pa.table({"round": [1, 2]})), 2.0))
