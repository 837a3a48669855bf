"""Every sweep file the project ships reads and expands into validated runs: a typo in a pinned
knob, a method renamed or a scenario moved shows here, not hours into a sweep on someone's machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from hdcfl_ray.sweeps.grid import expand, read_sweep_file

SWEEPS = Path(__file__).resolve().parents[1] / "scenarios" / "sweeps"


def _sweep_files() -> list[Path]:
    return sorted(SWEEPS.glob("*.yaml"))


def test_the_project_ships_sweep_files() -> None:
    assert len(_sweep_files()) >= 5


@pytest.mark.parametrize("path", _sweep_files(), ids=lambda path: path.name)
def test_a_shipped_sweep_expands_into_validated_runs(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # sweeps on real CIFAR-10 name its folder through this variable; expanding reads no data
    monkeypatch.setenv("HDCFL_CIFAR10_PARQUET", str(tmp_path / "cifar10"))
    plan = read_sweep_file(path, tmp_path / "out")
    runs = expand(plan)
    assert runs, f"{path.name} expands into no run"
    assert len({run.key for run in runs}) == len(runs)
    for run in runs:
        assert run.scenario.algorithm.name == run.algorithm
        assert run.scenario.seed == run.seed
        for key, value in (override.split("=", 1) for override in plan.overrides):
            if key.startswith(f"algorithm.{run.algorithm}."):
                knob = getattr(getattr(run.scenario.algorithm, run.algorithm), key.rsplit(".", 1)[1])
                assert str(knob) != "auto", f"{path.name}: {key} is pinned to {value} but the run has auto"
