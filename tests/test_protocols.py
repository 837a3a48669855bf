"""Participation, availability and stragglers on the virtual clock."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.config.schema import AvailabilityConfig, Distribution, StragglerConfig, SystemConfig
from hdcfl_ray.runtime.backends.local_host import in_process_run
from hdcfl_ray.runtime.server.sampling import available_clients, plan_round, select_clients
from hdcfl_ray.runtime.driver import prepare_run
from hdcfl_ray.runtime.server.virtual_clock import ClientProfile, client_profiles
from tests.conftest import tiny_scenario


def test_participation_fraction_and_seed_fix_who_trains_each_round():
    scenario = build_scenario(tiny_scenario(partition={"num_clients": 20}, protocol={"participation": 0.25}))
    assert scenario.clients_per_round() == 5
    first = [select_clients(20, 5, seed=1, round_index=t) for t in range(1, 6)]
    again = [select_clients(20, 5, seed=1, round_index=t) for t in range(1, 6)]
    other = [select_clients(20, 5, seed=2, round_index=t) for t in range(1, 6)]
    assert first == again
    assert first != other
    assert all(len(chosen) == 5 and len(set(chosen)) == 5 for chosen in first)
    assert len({tuple(chosen) for chosen in first}) > 1  # a new draw every round


def test_participation_count_is_a_number_of_clients():
    scenario = build_scenario(tiny_scenario(protocol={"participation": 3}))
    assert scenario.clients_per_round() == 3


def test_bernoulli_availability_is_seeded_and_near_its_probability():
    config = AvailabilityConfig(kind="bernoulli", probability=0.3)
    online = [available_clients(1000, config, seed=5, round_index=t) for t in range(1, 4)]
    assert online[0] == available_clients(1000, config, seed=5, round_index=1)
    assert all(250 < len(clients) < 350 for clients in online)
    assert online[0] != online[1]


def test_selection_only_draws_available_clients():
    chosen = select_clients(10, 3, seed=0, round_index=1, candidates=[2, 4, 6, 8])
    assert set(chosen) <= {2, 4, 6, 8} and len(chosen) == 3


def test_deadline_drops_exactly_the_clients_finishing_after_it():
    durations = {0: 1.0, 1: 5.0, 2: 2.5, 3: 2.0000001, 4: 2.0}
    plan = plan_round([0, 1, 2, 3, 4], durations, wanted=5, stragglers=StragglerConfig(deadline=2.0, policy="drop"))
    assert plan.trained == [0, 4]
    assert plan.dropped == [1, 2, 3]
    assert plan.round_duration == 2.0


def test_wait_all_keeps_everyone_and_lasts_as_long_as_the_slowest():
    durations = {0: 1.0, 1: 5.0}
    plan = plan_round([0, 1], durations, wanted=2, stragglers=StragglerConfig(deadline=2.0, policy="wait_all"))
    assert plan.trained == [0, 1] and plan.dropped == [] and plan.round_duration == 5.0


def test_over_selection_keeps_the_first_n_to_finish():
    durations = {0: 4.0, 1: 1.0, 2: 3.0, 3: 2.0, 4: 1.0}
    plan = plan_round([0, 1, 2, 3, 4], durations, wanted=3, stragglers=StragglerConfig(policy="over_select", over_selection=1.7))
    assert plan.trained == [1, 3, 4]
    assert plan.dropped == [0, 2]
    assert plan.round_duration == 2.0


def test_update_duration_follows_the_work_done():
    profile = ClientProfile(speed=50.0, delay=0.5)
    assert profile.update_duration(200) == pytest.approx(4.5)


def test_profiles_are_seeded_draws_from_the_distribution():
    system = SystemConfig(speed=Distribution(kind="lognormal", mean=math.log(100), sigma=0.5), delay=Distribution(kind="uniform", low=0.1, high=0.2))
    first = client_profiles(system, 50, seed=3)
    assert first == client_profiles(system, 50, seed=3)
    assert first != client_profiles(system, 50, seed=4)
    speeds = np.array([p.speed for p in first])
    assert 60 < np.median(speeds) < 160
    assert all(0.1 <= p.delay <= 0.2 for p in first)


def test_trace_file_overrides_profiles_and_rejects_unknown_clients(tmp_path):
    from hdcfl_ray.errors import ScenarioError

    trace = tmp_path / "trace.csv"
    trace.write_text("client_id,speed,delay,available_from,available_until\n1,10.0,2.0,5.0,50.0\n")
    profiles = client_profiles(SystemConfig(trace=str(trace)), 3, seed=0)
    assert profiles[1] == ClientProfile(speed=10.0, delay=2.0, available_from=5.0, available_until=50.0)
    assert not profiles[1].is_available(1.0) and profiles[1].is_available(10.0)
    trace.write_text("client_id,speed,delay\n7,10.0,2.0\n")
    with pytest.raises(ScenarioError, match="client_id 7"):
        client_profiles(SystemConfig(trace=str(trace)), 3, seed=0)


def test_a_run_with_a_deadline_logs_dropped_clients_with_their_virtual_times():
    scenario = build_scenario(
        tiny_scenario(
            algorithm={"name": "fedavg_se"},
            protocol={
                "rounds": 2,
                "system": {"speed": {"kind": "lognormal", "mean": 4.0, "sigma": 1.0}},
                "stragglers": {"deadline": 3.0, "policy": "drop"},
            },
        )
    )
    run = in_process_run(prepare_run(scenario))
    report = run.run_round(1)
    profiles = run.server.settings.profiles
    sizes = run.server.settings.client_train_sizes
    for timing in report.timings:
        finish = profiles[timing.client_id].update_duration(sizes[timing.client_id])
        assert timing.virtual_finish == pytest.approx(finish)
        assert (timing.status == "dropped_late") == (finish > 3.0)
    statuses = {t.status for t in report.timings}
    assert statuses == {"applied", "dropped_late"}  # this seed drops some clients and keeps others
    assert {u.client_id for u in report.uploads} == {t.client_id for t in report.timings if t.status == "applied"}
    assert report.virtual_time == pytest.approx(3.0 if any(t.status == "dropped_late" for t in report.timings) else max(t.virtual_finish for t in report.timings))


def test_drop_policy_without_a_deadline_is_a_scenario_error(write_scenario):
    from typer.testing import CliRunner

    from cli import app

    path = write_scenario(tiny_scenario(protocol={"stragglers": {"policy": "drop"}}))
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2
    assert "protocol.stragglers.deadline" in result.output
