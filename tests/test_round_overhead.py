"""benchmarks/round_overhead.py: one batched round timed part by part (its dry run)."""

from __future__ import annotations

import pytest

from benchmarks.round_overhead import KEYS, PARTS, measure


@pytest.mark.parametrize("per_client", [False, True])
def test_a_dry_run_times_every_part_of_a_batched_round(per_client: bool) -> None:
    measured = measure(dry_run=True, per_client=per_client)
    assert set(KEYS) <= set(measured) and measured["trained_together"] == measured["clients"] == 3
    assert all(measured[part] >= 0 for part in PARTS) and measured["step_loop_s"] > 0
    assert sum(measured[part] for part in PARTS) + measured["other_s"] == pytest.approx(measured["round_s"])
    assert measured["outside_share"] == pytest.approx(1 - measured["step_loop_s"] / measured["round_s"])
