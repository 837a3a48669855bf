"""The runtime's accounting under a privacy section: the rounds table's epsilon after each
round is the accountant's for the releases the method reported; privacy.max_epsilon ends
the run before the round that would pass it, saying so in the manifest and the terminal;
a resumed run reports the uninterrupted run's epsilons; the manifest records what the run
computed with. A run without the section has no epsilon."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.logs.table_writer import read_table
from hdcfl_ray.privacy.accountant import epsilon
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.terminal.live_view import LiveView, QuietObserver
from tests import dp_test_method
from tests.conftest import needs_accountant, tiny_scenario
from tests.stop_observer import resume_after_a_stop

DELTA = 1e-5
Q = 0.25  # participation 2 of 8 clients


@pytest.fixture
def dp_method(monkeypatch: pytest.MonkeyPatch):
    yield from dp_test_method.loaded(monkeypatch)


def private_scenario(privacy: dict, rounds: int = 4, backend: str = "local", **sections):
    return build_scenario(
        tiny_scenario(
            algorithm={"name": dp_test_method.NAME},
            privacy={"delta": DELTA, **privacy},
            protocol={"rounds": rounds, "participation": 2, **sections.pop("protocol", {})},
            runtime={"backend": "local", "num_cpus": 1} if backend == "local" else {"backend": backend},
            **sections,
        )
    )


def epsilons(run_dir: Path) -> list[float | None]:
    return [row["epsilon"] for row in sorted(read_table(run_dir, "rounds").to_pylist(), key=lambda row: row["round"])]


def manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


@needs_accountant
def test_the_epsilon_column_is_the_accountants_after_each_round(dp_method, tmp_path) -> None:
    run_dir = tmp_path / "run"
    run_simulation(prepare_run(private_scenario({"noise_multiplier": 1.2})), run_dir, QuietObserver())
    expected = [epsilon([(1.2, Q, rounds)], DELTA) for rounds in range(1, 5)]
    assert epsilons(run_dir) == pytest.approx(expected, rel=1e-12)
    assert all(later > earlier for earlier, later in zip(expected, expected[1:]))
    record = manifest(run_dir)["privacy"]
    assert record["epsilon"] == record["epsilon_rdp"] == pytest.approx(expected[-1])
    assert record["epsilon_prv"] is not None and record["epsilon_prv"] <= record["epsilon_rdp"]  # the estimate is tighter
    assert record["releases"] == [[1.2, Q, 4]] and record["rounds_run"] == 4 and record["stopped_at_privacy_budget"] is None


@needs_accountant
def test_the_manifest_records_what_the_run_computed_with(dp_method, tmp_path) -> None:
    run_dir = tmp_path / "run"
    scenario = private_scenario({"target_epsilon": 6.0, "clip": 0.7, "noise_cohort_size": 40, "accountant": "prv"}, rounds=3)
    prepared = prepare_run(scenario)
    run_simulation(prepared, run_dir, QuietObserver())
    record = manifest(run_dir)["privacy"]
    assert prepared.privacy is not None and record["noise_multiplier"] == prepared.privacy.noise_multiplier
    assert {key: record[key] for key in ("target_epsilon", "clip", "sample_rate", "rounds", "delta", "sampling", "accountant")} == {
        "target_epsilon": 6.0, "clip": 0.7, "sample_rate": Q, "rounds": 3, "delta": DELTA, "sampling": "poisson", "accountant": "prv",
    }  # fmt: skip
    assert (record["noise_cohort_size"], record["expected_cohort"], record["noise_cohort_factor"]) == (40, 2.0, 0.05)
    spent = epsilon([(record["noise_multiplier"], Q, 3)], DELTA, "prv")
    assert epsilons(run_dir)[-1] == pytest.approx(spent) and record["epsilon"] == pytest.approx(spent)
    assert 6.0 - 0.01 - 1e-3 <= spent <= 6.0 + 1e-3  # z was chosen for the target (PRV's estimate moves in its last digits)


@needs_accountant
def test_max_epsilon_stops_before_the_round_that_would_pass_it(dp_method, tmp_path) -> None:
    per_rounds = [epsilon([(1.0, Q, rounds)], DELTA) for rounds in range(1, 5)]
    limit = (per_rounds[1] + per_rounds[2]) / 2  # round 3 would pass it
    console = Console(file=io.StringIO(), width=400)
    run_dir = tmp_path / "run"
    summary = run_simulation(prepare_run(private_scenario({"noise_multiplier": 1.0, "max_epsilon": limit})), run_dir, LiveView(console))
    rows = sorted(read_table(run_dir, "rounds").to_pylist(), key=lambda row: row["round"])
    assert [row["round"] for row in rows] == [1, 2] and rows[-1]["evaluated"]  # the last round run is evaluated as a last round
    assert epsilons(run_dir) == pytest.approx(per_rounds[:2])
    record = manifest(run_dir)
    assert record["status"] == "completed"
    assert record["privacy"]["rounds_run"] == 2 and record["privacy"]["epsilon"] == pytest.approx(per_rounds[1])
    stopped = record["privacy"]["stopped_at_privacy_budget"]
    assert stopped.startswith("privacy.max_epsilon: the run stops after round 2") and "round 3's release" in stopped
    assert summary.rounds == 2 and summary.stopped_early == stopped
    assert f"stopped at the privacy budget after round 2: {stopped}" in console.file.getvalue()
    assert stopped in [row["message"] for row in read_table(run_dir, "events").to_pylist()]


@needs_accountant
def test_a_resumed_run_reports_the_uninterrupted_runs_epsilons(dp_method, tmp_path) -> None:
    scenario = private_scenario({"noise_multiplier": 1.0}, checkpoint={"every": 2})
    resume_after_a_stop(scenario, tmp_path, stop_after=3)  # resumes from round 2's checkpoint, redoing round 3
    reference, resumed = epsilons(tmp_path / "reference"), epsilons(tmp_path / "stopped")
    assert resumed == reference and len(reference) == 4
    assert manifest(tmp_path / "stopped")["privacy"]["epsilon"] == manifest(tmp_path / "reference")["privacy"]["epsilon"]


def test_a_run_without_privacy_has_no_epsilon(dp_method, tmp_path) -> None:
    scenario = build_scenario(tiny_scenario(algorithm={"name": dp_test_method.NAME}, protocol={"rounds": 2}, runtime={"backend": "local"}))
    run_dir = tmp_path / "run"
    run_simulation(prepare_run(scenario), run_dir, QuietObserver())
    assert epsilons(run_dir) == [None, None]
    assert "privacy" not in manifest(run_dir)


@pytest.mark.slow  # Ray actors: the slow tier
@pytest.mark.ray
@needs_accountant
def test_the_server_actor_on_ray_accounts_as_the_local_server(dp_method, ray_session, tmp_path) -> None:
    local, on_ray = tmp_path / "local", tmp_path / "ray"
    run_simulation(prepare_run(private_scenario({"noise_multiplier": 1.0}, rounds=3)), local, QuietObserver())
    run_simulation(prepare_run(private_scenario({"noise_multiplier": 1.0}, rounds=3, backend="ray")), on_ray, QuietObserver())
    assert manifest(on_ray)["runtime"]["backend"] == "ray"
    assert epsilons(on_ray) == epsilons(local) and manifest(on_ray)["privacy"]["epsilon"] == manifest(local)["privacy"]["epsilon"]
