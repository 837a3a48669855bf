"""benchmarks/privacy_cost.py: its scenarios, the in-process mechanism timing and the table,
at toy sizes (no timing is asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import privacy_cost
from hdcfl_ray.config.loading import build_scenario as validate_scenario
from hdcfl_ray.privacy.opacus_extra import INSTALL_HINT, PrivacyExtraMissing
from tests.conftest import needs_accountant

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("method", privacy_cost.METHODS)
def test_the_sides_differ_only_in_the_privacy_section(method: str, tmp_path: Path) -> None:
    plain = privacy_cost.build_scenario(1000, 3, 1.0, method, "plain", tmp_path)
    assert "privacy" not in plain and plain["algorithm"] == {"name": method}
    assert plain["partition"]["num_clients"] == 1000 and plain["protocol"]["participation"] == 1.0
    for variant in privacy_cost.VARIANTS:
        private = privacy_cost.build_scenario(1000, 3, 1.0, method, variant, tmp_path)
        # z given, no target_epsilon: the scenario is valid as it is
        assert private.pop("privacy") == {"noise_multiplier": 1.0, "clip": 1.0, "sampling": variant}
        assert {k: v for k, v in private.items() if k != "name"} == {k: v for k, v in plain.items() if k != "name"}
        scenario = validate_scenario(privacy_cost.build_scenario(1000, 3, 1.0, method, variant, tmp_path), source="privacy_cost")
        assert scenario.privacy.noise_multiplier == 1.0 and scenario.privacy.target_epsilon is None


def test_the_mechanism_is_timed_in_process() -> None:
    for threads in (None, 1):
        seconds = privacy_cost.mechanism_seconds(4, 500, 10, repeats=2, blas_threads=threads)
        assert set(seconds) == {"clip_s", "sum_s"} and all(value > 0 for value in seconds.values())
    assert all(value > 0 for value in privacy_cost.mechanism_seconds(3, 500, 0, repeats=1).values())
    encoder, head = privacy_cost.model_sizes()
    assert encoder > 0 and head == 64 * 10 + 10  # the scenario's linear head: 64 features, 10 classes


def test_the_table_gives_each_method_its_ratio_against_its_own_plain_runs() -> None:
    def records(*rounds: float) -> list[dict[str, float]]:
        return [{"round_s": r, "aggregate_s": 0.01, "participants": 1000.0} for r in rounds]

    measured = {("fedavg", "plain"): records(2.0, 2.2, 2.1), ("fedavg", "fixed"): records(2.1, 2.2, 2.3)}
    mechanism = {"fedavg": {"clip_s": 0.03, "sum_s": 0.012}, "fedavg 1 thread": {"clip_s": 0.01, "sum_s": 0.01}}
    plain, private = privacy_cost.summarise(measured, mechanism, ["fedavg"], ["fixed"])
    assert plain["vs plain"] == 1.0 and plain["mechanism s"] is None and plain["processes"] == 3
    assert private["round s"] == 2.2 and private["vs plain"] == pytest.approx(2.2 / 2.1, abs=1e-3)
    assert private["pairs' ratios"] == "1.000-1.095" and private["plain's spread"] == "9.5%"
    assert private["mechanism s"] == 0.042 and private["mechanism / round"] == "2.0%" and private["1 BLAS thread s"] == 0.02


def test_without_opacus_it_stops_before_any_run_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> None:
        raise PrivacyExtraMissing(f"privacy accounting needs Opacus, which could not be imported (no opacus): {INSTALL_HINT}")

    monkeypatch.setattr("hdcfl_ray.privacy.opacus_extra.opacus_accountants", missing)
    with pytest.raises(SystemExit, match="dp extra") as stopped:
        privacy_cost.require_opacus()
    assert INSTALL_HINT in str(stopped.value)


@pytest.mark.slow
@needs_accountant
def test_a_toy_run_prints_and_appends_the_table(tmp_path: Path) -> None:
    out = tmp_path / "bench.md"
    command = [sys.executable, "-m", "benchmarks.privacy_cost", "--clients", "5", "--rounds", "2", "--repeats", "1",
               "--methods", "fedavg", "--variants", "fixed", "--out", str(out)]
    finished = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr[-3000:]
    text = out.read_text()
    assert "Command: `python -m benchmarks.privacy_cost --clients 5 --rounds 2" in text and "Machine: cpu" in text
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("| fedavg")]
    assert [row[:3] for row in rows] == [["fedavg", "none", "5"], ["fedavg", "fixed, z 1, C 1", "5"]]
