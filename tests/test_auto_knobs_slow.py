"""With `auto`, PACFL and IFCA are not below Local by more than the seed spread on
digits under label skew (3 classes per client) and Dirichlet skew (alpha 0.3), 20
clients, 20 rounds, at seeds no choice was tuned on: the report flags neither "below
Local" (its rule: a mean below Local's by more than the larger of the two seed stds).
The same runs as `hdcfl-ray sweep scenarios/auto/sweep.yaml` (docs/calibration.md,
"auto"), on the local backend: about half an hour on 2 shared cores."""

from __future__ import annotations

from pathlib import Path

import pytest

import hdcfl_ray
from analysis.final_metrics import run_metrics
from analysis.row_flags import row_flags
from analysis.runs import load_runs

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios" / "auto"
SEEDS = (101, 202, 303)


@pytest.mark.slow
@pytest.mark.auto_knobs
@pytest.mark.parametrize("setting", ["digits-ls3.yaml", "digits-a0.3.yaml"])
def test_pacfl_and_ifca_with_auto_are_not_below_local(tmp_path: Path, setting: str) -> None:
    for method in ("local", "pacfl", "ifca"):
        for seed in SEEDS:
            hdcfl_ray.simulate(
                SCENARIOS / setting,
                overrides={"algorithm.name": method, "seed": seed, "runtime.backend": "local", "output.dir": str(tmp_path)},
                out=tmp_path / f"{method}-seed{seed}",
                progress=False,
            )
    records = run_metrics(load_runs([tmp_path]))
    flags = row_flags(records)
    for method in ("pacfl", "ifca"):
        found = [found for (_, row), found in flags.items() if row == method]
        assert not any("below Local" in flag for flag_list in found for flag in flag_list), (method, found)
    assert all(isinstance(record.auto_knobs, dict) for record in records if record.method != "local")
