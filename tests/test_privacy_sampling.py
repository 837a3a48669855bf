"""Poisson sampling under privacy.sampling: poisson: each training client joins a round
independently with rate q, from the round's own seeded stream; a round may draw none, and
the method's aggregate is then called with no update; newcomers are never drawn;
privacy.sampling: fixed keeps protocol.participation's fixed-size sample."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.data.partitions.newcomers import scenario_newcomers
from hdcfl_ray.logs.table_writer import read_table
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.runtime.server.sampling import poisson_sample
from hdcfl_ray.terminal.live_view import QuietObserver
from tests import dp_test_method
from tests.conftest import needs_accountant, tiny_scenario


@pytest.fixture
def dp_method(monkeypatch: pytest.MonkeyPatch):
    yield from dp_test_method.loaded(monkeypatch)


def test_a_round_draws_the_same_clients_for_the_same_seed_and_round() -> None:
    everyone = list(range(40))
    assert poisson_sample(40, 0.3, 7, 5, everyone) == poisson_sample(40, 0.3, 7, 5, everyone)
    assert poisson_sample(40, 0.3, 7, 5, everyone) != poisson_sample(40, 0.3, 7, 6, everyone)
    assert poisson_sample(40, 0.3, 7, 5, everyone) != poisson_sample(40, 0.3, 8, 5, everyone)
    drawn = poisson_sample(40, 0.3, 7, 5, everyone)
    assert drawn == sorted(drawn) and len(set(drawn)) == len(drawn)


def test_the_mean_count_is_q_times_the_clients() -> None:
    clients, rate, rounds = 50, 0.2, 2000
    counts = np.array([len(poisson_sample(clients, rate, 3, round_index, list(range(clients)))) for round_index in range(1, rounds + 1)])
    assert abs(counts.mean() - rate * clients) < 0.3  # its standard error is 0.06
    assert counts.var() == pytest.approx(clients * rate * (1 - rate), rel=0.15)  # binomial, not fixed-size
    assert (counts == 0).sum() == 0 and counts.min() < counts.max()


def test_a_small_rate_leaves_some_rounds_empty() -> None:
    counts = [len(poisson_sample(8, 0.1, 3, round_index, list(range(8)))) for round_index in range(1, 101)]
    assert 0 in counts


def test_a_clients_draw_depends_on_itself_alone_and_newcomers_are_never_drawn() -> None:
    newcomers = {2, 5, 11}
    training = [client for client in range(20) if client not in newcomers]
    for round_index in range(1, 200):
        everyone = poisson_sample(20, 0.5, 9, round_index, list(range(20)))
        drawn = poisson_sample(20, 0.5, 9, round_index, training)
        assert not newcomers & set(drawn)
        assert drawn == [client for client in everyone if client not in newcomers]


def run_rows(scenario, folder: Path) -> tuple[list[dict], list[dict], list[str]]:
    run_simulation(prepare_run(scenario), folder, QuietObserver())
    events = [row["message"] for row in read_table(folder, "events").to_pylist()]
    return read_table(folder, "rounds").to_pylist(), read_table(folder, "updates").to_pylist(), events


def private_scenario(privacy: dict, seed: int = 7, **sections):
    return build_scenario(
        tiny_scenario(
            seed=seed, algorithm={"name": dp_test_method.NAME}, privacy=privacy, runtime={"backend": "local", "num_cpus": 1}, **sections
        )
    )


@needs_accountant
def test_an_empty_poisson_round_still_aggregates_and_releases(dp_method, tmp_path) -> None:
    rounds, rate = 4, 1 / 8  # participation 1 of 8 clients
    # a seed whose draws leave a round empty (and train in another)
    seed = next(
        seed for seed in range(200)
        if {len(poisson_sample(8, rate, seed, r, list(range(8)))) == 0 for r in range(1, rounds + 1)} == {True, False}
    )  # fmt: skip
    scenario = private_scenario({"noise_multiplier": 1.0}, seed=seed, protocol={"rounds": rounds, "participation": 1})
    rows, updates, events = run_rows(scenario, tmp_path / "run")
    expected = {r: poisson_sample(8, rate, seed, r, list(range(8))) for r in range(1, rounds + 1)}
    assert {r: sorted(u["client_id"] for u in updates if u["round"] == r) for r in expected} == expected
    assert dp_test_method.AGGREGATED == [(r, len(expected[r])) for r in range(1, rounds + 1)]  # empty rounds included
    empty = [r for r in expected if not expected[r]]
    assert [row["num_participants"] for row in rows if row["round"] in empty] == [0] * len(empty)
    epsilons = [row["epsilon"] for row in rows]
    assert all(later > earlier for earlier, later in zip(epsilons, epsilons[1:]))  # an empty round's release counts too
    assert sum("privacy.sampling: poisson drew no client this round" in message for message in events) == len(empty)


@needs_accountant
def test_newcomers_never_train_under_poisson_sampling(dp_method, tmp_path) -> None:
    scenario = private_scenario({"noise_multiplier": 1.0}, partition={"newcomers": 3}, protocol={"rounds": 3, "participation": 1.0})
    newcomers = set(scenario_newcomers(scenario))
    _, updates, _ = run_rows(scenario, tmp_path / "run")
    trained = {row["client_id"] for row in updates}
    assert len(newcomers) == 3 and not newcomers & trained
    assert trained == set(range(8)) - newcomers  # q = 1: every training client, every round


@needs_accountant
def test_fixed_sampling_keeps_the_participation_sample(dp_method, tmp_path) -> None:
    scenario = private_scenario({"noise_multiplier": 1.0, "sampling": "fixed"}, protocol={"rounds": 3, "participation": 3})
    rows, _, _ = run_rows(scenario, tmp_path / "run")
    assert [row["num_participants"] for row in rows] == [3, 3, 3]
    assert prepare_run(scenario).privacy.sample_rate == 1.0  # type: ignore[union-attr]
