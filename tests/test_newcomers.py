"""Newcomers (partition.newcomers): clients held out of every round and scored at each
evaluated round by the method's own newcomer rule (docs/newcomers.md).

They never train, never appear in a training row, a training ledger or the server's
training state; the same seed gives the same newcomers and bits; a run without them
is today's run to the bit; HDC-FL places a head as its refresh placed the cached
ones; on the quickstart's rotation groups IFCA's and HDC-FL's newcomers land in their
planted group; a method without a rule says so; and a resumed run writes the same
newcomer rows."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from hdcfl_ray import plugins
from hdcfl_ray.algorithms.pacfl import nearest_cluster
from hdcfl_ray.algorithms.registry import method_names, method_specs
from hdcfl_ray.config.loading import build_scenario, load_scenario
from hdcfl_ray.contract import NO_NEWCOMER_RULE
from hdcfl_ray.data.partitions.newcomers import newcomer_ids, scenario_newcomers
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.hdcfl.placement import place_head
from hdcfl_ray.logs.table_writer import read_table
from hdcfl_ray.runtime.backends.local_host import in_process_run
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.terminal.live_view import QuietObserver
from tests.conftest import slow_beyond, tiny_scenario
from tests.stop_observer import resume_after_a_stop

QUICKSTART = Path(__file__).parents[1] / "scenarios" / "quickstart.yaml"


def scenario_with_newcomers(name: str = "hdcfl", newcomers: int | float | None = 2, **sections):
    partition = {**sections.pop("partition", {}), "newcomers": newcomers}
    return build_scenario(tiny_scenario(algorithm={"name": name, **sections.pop("algorithm", {})}, partition=partition, **sections))


def run_folder(scenario, folder: Path) -> Path:
    run_simulation(prepare_run(scenario), folder, QuietObserver())
    return folder


# ---- the scenario keys ----


def test_newcomers_are_a_seeded_choice_among_the_clients() -> None:
    assert newcomer_ids(20, 4, 42) == newcomer_ids(20, 4, 42)
    assert newcomer_ids(20, 4, 42) != newcomer_ids(20, 4, 43)
    chosen = newcomer_ids(20, 5, 7)
    assert len(set(chosen)) == 5 and list(chosen) == sorted(chosen) and all(0 <= k < 20 for k in chosen)
    assert newcomer_ids(20, 0, 7) == ()
    scenario = scenario_with_newcomers(newcomers=0.25)  # a fraction of the 8 clients
    assert scenario.partition.newcomer_count() == 2
    assert scenario_newcomers(scenario) == newcomer_ids(8, 2, scenario.seed)


@pytest.mark.parametrize("value", [0, 1.0, 1.5, -1, True, 8])
def test_a_newcomer_count_that_is_not_a_share_of_the_clients_is_refused(value: object) -> None:
    with pytest.raises(ScenarioError, match="partition.newcomers"):
        build_scenario(tiny_scenario(partition={"newcomers": value}))


def test_participation_counts_the_clients_that_train() -> None:
    assert scenario_with_newcomers(newcomers=2, protocol={"participation": 0.5}).clients_per_round() == 3  # half of 6
    assert build_scenario(tiny_scenario(protocol={"participation": 0.5})).clients_per_round() == 4  # half of 8, as before
    with pytest.raises(ScenarioError, match="more than the 6 clients that train"):
        scenario_with_newcomers(newcomers=2, protocol={"participation": 7})
    with pytest.raises(ScenarioError, match="protocol.eval_clients: 7 clients is more than the 6 clients that train"):
        scenario_with_newcomers(newcomers=2, protocol={"eval_clients": 7})


def test_every_method_declares_a_rule_and_has_its_hooks() -> None:
    """Every built-in method has a newcomer rule (a plugin may have none: it then says so);
    building one checks its hooks (algorithms/registry.py)."""
    for name, spec in method_specs().items():
        assert spec.newcomer_rule, name


# ---- newcomers stay out of training ----


@pytest.mark.parametrize("method", ["pacfl", "fedsoft", "hdcfl"])
def test_newcomers_never_train_nor_enter_a_training_row_the_ledger_or_the_server_state(method: str) -> None:
    """PACFL and FedSoft probe every client, HDC-FL caches every upload: none of it reaches a
    newcomer. Round 1 is not evaluated, so a newcomer's first bytes are its evaluation's, under
    the newcomer label."""
    scenario = scenario_with_newcomers(method, 2, protocol={"rounds": 3, "eval_every": 2})  # HDC-FL refreshes from round 2
    newcomers = set(scenario_newcomers(scenario))
    run = in_process_run(prepare_run(scenario))
    try:
        reports = run.run_all()
    finally:
        run.close()
    for report in reports:
        assert newcomers.isdisjoint(report.selected) and newcomers.isdisjoint(u.client_id for u in report.uploads)
        assert newcomers.isdisjoint(e.client_id for e in report.eval_reports)
        assert newcomers.isdisjoint(report.traffic.clients)
        evaluated = bool(report.eval_reports)
        assert {r.client_id for r in report.newcomers} == (newcomers if evaluated else set())
        assert set(report.traffic.newcomers) == (newcomers if evaluated else set())
    assert not reports[0].eval_reports and reports[0].traffic.newcomers == {}  # nothing before their first evaluation
    assert all(len(report.uploads) == 6 for report in reports)  # full participation = the 6 that train
    state = run.server.state
    if method == "pacfl":
        assert set(state.labels) == set(range(8)) - newcomers and set(state.bases) == set(state.labels)
    elif method == "fedsoft":
        assert all(state.num_samples[k] == 0 for k in newcomers)
        assert all(state.clients[k] is state.clients[min(newcomers)] for k in newcomers)  # the initial model, never replaced
    else:
        assert newcomers.isdisjoint(state.cache) and newcomers.isdisjoint(state.personalisation.memberships)


def test_the_tables_keep_newcomers_out_of_the_training_rows(tmp_path: Path) -> None:
    scenario = scenario_with_newcomers("fedavg", 2)
    newcomers = set(scenario_newcomers(scenario))
    folder = run_folder(scenario, tmp_path / "run")
    clients, updates = read_table(folder, "clients").to_pydict(), read_table(folder, "updates").to_pydict()
    assert newcomers.isdisjoint(clients["client_id"]) and newcomers.isdisjoint(updates["client_id"])
    rows = read_table(folder, "newcomers").to_pydict()
    assert sorted(zip(rows["round"], rows["client_id"])) == [(t, k) for t in (1, 2, 3) for k in sorted(newcomers)]
    # FedAvg sends a newcomer the global model: its bytes, under the newcomer label only
    model_bytes = 4 * sum(array.size for array in prepare_and_build_initial(scenario))
    assert set(rows["bytes_down"]) == {model_bytes} and set(rows["bytes_up"]) == {0}
    rounds = read_table(folder, "rounds").to_pydict()
    assert rounds["newcomer_bytes_down"] == [2 * model_bytes] * 3
    assert rounds["num_newcomers"] == [2] * 3 and rounds["num_evaluated"] == [6] * 3
    assert rounds["bytes_down"] == [6 * model_bytes] * 3  # the training clients' downloads alone
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["evaluation"]["newcomers"] == sorted(newcomers) and manifest["evaluation"]["clients_scored"] == 6


def prepare_and_build_initial(scenario) -> list[np.ndarray]:
    from hdcfl_ray.runtime.initial_model import initial_parameters

    prepared = prepare_run(scenario)
    initial = initial_parameters(prepared.scenario, prepared.dataset)
    return [initial.encoder, initial.head]


def test_asynchronous_runs_never_dispatch_a_newcomer() -> None:
    scenario = scenario_with_newcomers(
        "fedavg_se", 2, protocol={"mode": "async", "rounds": 4, "eval_every": 2, "asynchronous": {"aggregation": "fedbuff", "buffer_size": 2}}
    )
    newcomers = set(scenario_newcomers(scenario))
    run = in_process_run(prepare_run(scenario))
    try:
        reports = run.run_all()
    finally:
        run.close()
    assert all(newcomers.isdisjoint(report.selected) and newcomers.isdisjoint(report.traffic.clients) for report in reports)
    assert [sorted(r.client_id for r in report.newcomers) for report in reports] == [[], sorted(newcomers), [], sorted(newcomers)]


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_ray_hosts_score_newcomers_as_the_local_backend_does(tmp_path: Path) -> None:
    """PACFL (a probe before the evaluation job): the same rows on Ray's hosts as in one process."""
    tables = {}
    for backend in ("local", "ray"):
        scenario = scenario_with_newcomers("pacfl", 2, protocol={"rounds": 2}, runtime={"backend": backend})
        tables[backend] = read_table(run_folder(scenario, tmp_path / backend), "newcomers").sort_by([("round", "ascending"), ("client_id", "ascending")])
    for column in ("client_id", "accuracy", "loss", "group", "bytes_down", "bytes_up"):
        assert tables["ray"].column(column).to_pylist() == tables["local"].column(column).to_pylist(), column
    assert min(tables["ray"].column("bytes_up").to_pylist()) > 0  # the subspace basis went up


# ---- bits ----


def test_the_same_seed_gives_the_same_newcomers_and_bits(tmp_path: Path) -> None:
    scenario = scenario_with_newcomers("hdcfl", 2, algorithm={"hdcfl": {"activation_round": 1}})
    first, second = (pq.read_table(run_folder(scenario, tmp_path / name) / "newcomers.parquet").sort_by("round") for name in ("a", "b"))
    assert first.to_pydict() == second.to_pydict()
    assert any(value is not None for value in first.column("group").to_pylist())  # placed among the groups


def test_without_newcomers_a_run_is_todays_to_the_bit(tmp_path: Path) -> None:
    """The golden quickstart rows (tests/golden, this machine's arithmetic) are unchanged, and no
    newcomer table, column or manifest entry appears."""
    from tests.bit_reference import arithmetic_key, golden_files, quickstart_rows
    from tests.test_cpu_bits_pinned import assert_within_cross_machine_rounding

    rows = quickstart_rows("hdcfl", tmp_path / "run")
    golden = {key: json.loads(path.read_text()) for key, path in golden_files().items()}
    if arithmetic_key() in golden and "hdcfl" in golden[arithmetic_key()]:
        assert rows == golden[arithmetic_key()]["hdcfl"]
    else:
        reference = next(record["hdcfl"] for record in golden.values() if "hdcfl" in record)
        assert_within_cross_machine_rounding(rows, reference, "no golden file for this machine")
    assert not (tmp_path / "run" / "newcomers.parquet").exists()
    rounds = read_table(tmp_path / "run", "rounds").to_pydict()
    assert set(rounds["num_newcomers"]) == {None} and set(rounds["newcomer_mean_accuracy"]) == {None}
    assert "newcomers" not in json.loads((tmp_path / "run" / "manifest.json").read_text())["evaluation"]


# ---- the rules ----


@pytest.mark.parametrize(("membership", "scale", "descriptor"), [("soft", "within", "lowrank"), ("soft", "between", "lowrank"), ("hard", "within", "lowrank"), ("soft", "within", "raw")])
def test_hdcfl_places_a_trained_clients_head_where_its_refresh_placed_it(membership: str, scale: str, descriptor: str) -> None:
    """The newcomer path's pure function on a client that did train: its cached head gives
    its stored membership row (to 1e-6) and its group."""
    hdcfl = {"groups": 2, "activation_round": 2, "refresh_every": 1, "membership": membership, "temperature_scale": scale, "descriptor": descriptor}
    run = in_process_run(prepare_run(scenario_with_newcomers("hdcfl", 2, algorithm={"hdcfl": hdcfl})))
    try:
        run.run_all()
    finally:
        run.close()
    state = run.server.state
    personalisation = state.personalisation
    assert personalisation.geometry is not None and len(personalisation.memberships) == 6
    for client_id, row in personalisation.memberships.items():
        placement = place_head(personalisation.geometry, state.cache[client_id].head)
        np.testing.assert_allclose(placement.memberships, row, atol=1e-6, rtol=0)
        assert placement.group == personalisation.group_labels[client_id]


def test_pacfl_places_a_trained_clients_subspace_in_its_own_cluster() -> None:
    rng = np.random.default_rng(0)
    bases = {k: np.linalg.qr(rng.normal(size=(20, 3)))[0] for k in range(5)}
    labels = {0: 0, 1: 1, 2: 0, 3: 2, 4: 1}
    for proximity in ("principal", "elementwise"):
        assert [nearest_cluster(bases[k], bases, labels, proximity) for k in range(5)] == [labels[k] for k in range(5)]


def test_local_newcomers_train_alone_for_the_budget(tmp_path: Path) -> None:
    scenario = scenario_with_newcomers("local", 2, protocol={"rounds": 1, "newcomer_epochs": 2})
    rows = read_table(run_folder(scenario, tmp_path / "run"), "newcomers").to_pydict()
    assert rows["samples_trained"] == [2 * n for n in rows["num_train_samples"]]
    assert rows["bytes_down"] == [0, 0] and set(rows["reference"]) == {"local"}


@pytest.mark.parametrize("method", slow_beyond(sorted(method_names()), fast={"fedavg", "ifca", "fedbabu", "fedsoft", "pacfl"}))
def test_every_method_scores_its_newcomers_by_its_declared_rule(method: str, tmp_path: Path) -> None:
    scenario = scenario_with_newcomers(method, 2, protocol={"rounds": 2})
    rows = read_table(run_folder(scenario, tmp_path / "run"), "newcomers").to_pydict()
    assert len(rows["client_id"]) == 4 and set(rows["rule"]) == {method_specs()[method].newcomer_rule}
    assert all(0.0 <= accuracy <= 1.0 for accuracy in rows["accuracy"]) and all(np.isfinite(rows["loss"]))


@pytest.fixture
def method_without_a_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A plugin method that inherits FedAvg's hooks but declares no newcomer rule."""
    module = "hdcfl_newcomer_free_plugin"
    (tmp_path / f"{module}.py").write_text(
        textwrap.dedent(
            '''
            from hdcfl_ray.algorithms.fedavg import FedAvg
            from hdcfl_ray.contract import MethodSpec


            class Unruled(FedAvg):
                name = "unruled_avg"


            METHOD = MethodSpec(name="unruled_avg", summary="FedAvg declaring no newcomer rule", build=lambda _params, run: Unruled(run.server_optimizer))
            '''
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(plugins.ENV_VAR, raising=False)
    plugins.load_plugins([module])
    yield "unruled_avg"
    os.environ.pop(plugins.ENV_VAR, None)
    plugins.clear_caches()
    sys.modules.pop(module, None)


def test_a_method_without_a_rule_says_so_in_every_newcomer_row(method_without_a_rule: str, tmp_path: Path) -> None:
    scenario = scenario_with_newcomers(method_without_a_rule, 2, protocol={"rounds": 2}, runtime={"backend": "local"})
    folder = run_folder(scenario, tmp_path / "run")
    rows = read_table(folder, "newcomers").to_pydict()
    assert len(rows["client_id"]) == 4 and set(rows["rule"]) == {NO_NEWCOMER_RULE}
    assert set(rows["accuracy"]) == {None} and set(rows["bytes_down"]) == {0}  # nothing sent, nothing scored: no zero
    rounds = read_table(folder, "rounds").to_pydict()
    assert rounds["num_newcomers"] == [2, 2] and rounds["newcomer_mean_accuracy"] == [None, None]
    assert json.loads((folder / "manifest.json").read_text())["evaluation"]["newcomer_rule"] == NO_NEWCOMER_RULE


# ---- placement on planted groups ----


@pytest.mark.slow
@pytest.mark.parametrize(("method", "seed"), [("hdcfl", 123), ("ifca", 7)])
def test_quickstart_newcomers_land_in_their_planted_group(method: str, seed: int, tmp_path: Path) -> None:
    """The quickstart's four rotation groups, four newcomers (of groups 0, 3, 1, 2 at seed 123;
    2, 1, 2, 3 at seed 7), 12 rounds, at seeds where the trained clients' groups are the planted
    ones (ARI 1; IFCA merges two rotation groups at seed 123 in 12 rounds): every newcomer is
    placed in the group its planted group's clients hold."""
    scenario = load_scenario(
        QUICKSTART,
        [
            f"algorithm.name={method}", f"seed={seed}", "protocol.rounds=12", "partition.newcomers=4", "algorithm.hdcfl.groups=4",
            "algorithm.ifca.clusters=4", "output.save_refresh_cache=false", "runtime.backend=local",
        ],
    )
    folder = run_folder(scenario, tmp_path / "run")
    clients = read_table(folder, "clients").to_pydict()
    last = max(clients["round"])
    found = {truth: group for t, truth, group in zip(clients["round"], clients["true_group"], clients["group"]) if t == last}
    assert read_table(folder, "rounds").to_pydict()["ari_true"][-1] == 1.0 and len(set(found.values())) == 4
    rows = read_table(folder, "newcomers").to_pydict()
    placed = [(truth, group) for t, truth, group in zip(rows["round"], rows["true_group"], rows["group"]) if t == last]
    assert len(placed) == 4 and len({truth for truth, _ in placed}) >= 3
    assert all(group == found[truth] for truth, group in placed)
    assert read_table(folder, "rounds").to_pydict()["newcomer_ari_with_clients"][-1] == 1.0


# ---- resume ----


def test_a_resumed_run_writes_the_same_newcomer_rows(tmp_path: Path) -> None:
    scenario = scenario_with_newcomers(
        "hdcfl", 2, protocol={"rounds": 4}, checkpoint={"every": 2}, algorithm={"hdcfl": {"activation_round": 1}}, runtime={"backend": "local"}
    )
    resume_after_a_stop(scenario, tmp_path, stop_after=3)
    reference, resumed = (pq.read_table(tmp_path / name / "newcomers.parquet").sort_by([("round", "ascending"), ("client_id", "ascending")]) for name in ("reference", "stopped"))
    assert resumed.num_rows == reference.num_rows == 8
    for column in ("client_id", "accuracy", "loss", "group", "memberships", "samples_trained", "bytes_down"):
        assert resumed.column(column).to_pylist() == reference.column(column).to_pylist(), column
