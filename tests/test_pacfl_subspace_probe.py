"""studies/pacfl_subspace_probe.py: the table it writes holds what PACFL's own functions
give on the scenario's clients, and the reason it names holds: bases whose ranks sum above
the input dimension meet, so their smallest principal angle is 0."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hdcfl_ray.algorithms.pacfl_subspaces import smallest_principal_angle
from studies import pacfl_subspace_probe

ROOT = Path(__file__).resolve().parents[1]


@settings(max_examples=25, deadline=None)
@given(dimension=st.integers(4, 24), first=st.integers(1, 24), second=st.integers(1, 24), seed=st.integers(0, 2**31 - 1))
def test_bases_whose_ranks_exceed_the_dimension_meet_at_angle_zero(dimension, first, second, seed):
    rng = np.random.default_rng(seed)
    first, second = min(first, dimension), min(second, dimension)
    angle = smallest_principal_angle(rng.normal(size=(dimension, first)), rng.normal(size=(dimension, second)))
    if first + second > dimension:
        assert angle < 1e-6
    else:
        assert angle > 1e-6  # random subspaces that fit side by side meet only at 0 with probability 0


def test_the_probe_writes_one_row_per_basis_and_proximity(tmp_path):
    out = tmp_path / "probe.md"
    scenario = ROOT / "scenarios" / "quickstart.yaml"
    assert pacfl_subspace_probe.main([str(scenario), "--set", "partition.num_clients=8", "--out", str(out)]) == 0
    text = out.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| per_class") or line.startswith("| whole")]
    assert len(rows) == len(pacfl_subspace_probe.BASES) * len(pacfl_subspace_probe.PROXIMITIES)
    assert "d = 64 input dimensions" in text and "4 planted groups" in text
    whole_p1 = next(row for row in rows if row.startswith("| whole | 1 | principal"))
    assert "| 1-1 of 64 |" in whole_p1
    assert "--set partition.num_clients=8" in text
