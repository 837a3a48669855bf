"""What an `auto` choice costs and what it can be trusted for: values that give the same
run train once (PACFL's thresholds that cut the clients into the same clusters), a knob
that changes no training is scored on replays of one run (HDC-FL's G), a choice at the
edge of its grid tries the value beyond it and says where it stopped, a failed candidate
is tried again by the next run, and data regenerated at the same path gets a new choice."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

import hdcfl_ray
from hdcfl_ray.auto_knobs.cache import CACHE_VARIABLE
from hdcfl_ray.auto_knobs.choose import choose_auto_knobs
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from tests.conftest import tiny_scenario
from tests.digits_parquet import write_digits_parquet

pytestmark = pytest.mark.auto_knobs


@pytest.fixture(autouse=True)
def _cache_of_this_test(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "cache"))


def _small(method: str, section: dict[str, Any], **changes: Any) -> dict[str, Any]:
    scenario = tiny_scenario(
        algorithm={"name": method, method: section},
        partition={"num_clients": 8, "test_per_client": 20},
        protocol={"rounds": 3},
        runtime={"backend": "local"},
    )
    for key, value in changes.items():
        scenario[key] = {**scenario.get(key, {}), **value} if isinstance(value, dict) else value
    return scenario


def _record(run: hdcfl_ray.Run) -> dict[str, Any]:
    (knob,) = run.manifest["auto_knobs"]["knobs"]
    return knob


def test_pacfl_thresholds_that_give_the_same_clusters_train_once_and_the_middle_one_is_chosen(tmp_path: Path) -> None:
    run = hdcfl_ray.simulate(_small("pacfl", {"threshold": "auto", "threshold_unit": "degrees", "basis": "whole"}), out=tmp_path / "run", progress=False)
    knob = _record(run)
    trained = [c for c in knob["candidates"] if c["samples_trained"] > 0]
    shared = [c for c in knob["candidates"] if c.get("same_run_as") is not None]
    assert trained and shared and len(trained) + len(shared) == len(knob["candidates"])
    for candidate in shared:  # a shared candidate has its twin's score and folder, and trained nothing
        twin = next(c for c in knob["candidates"] if c["value"] == candidate["same_run_as"])
        assert candidate["validation_mean_accuracy"] == twin["validation_mean_accuracy"] and candidate["run_dir"] == twin["run_dir"]
    folders = {c["run_dir"] for c in knob["candidates"]}
    assert len(folders) == len(trained)
    # of the values that give the winning run, the middle one
    chosen = knob["chosen"]
    root = next(c for c in knob["candidates"] if c["value"] == chosen).get("same_run_as") or chosen
    twins = sorted(c["value"] for c in knob["candidates"] if (c.get("same_run_as") or c["value"]) == root)
    assert chosen == twins[(len(twins) - 1) // 2]
    assert next(c for c in knob["candidates"] if c["value"] == root)["validation_mean_accuracy"] == max(
        c["validation_mean_accuracy"] for c in knob["candidates"]
    )


def test_hdcfl_groups_train_one_candidate_and_replay_its_refreshes_for_the_others(tmp_path: Path) -> None:
    run = hdcfl_ray.simulate(_small("hdcfl", {"groups": "auto", "activation_round": 2, "refresh_every": 1}), out=tmp_path / "run", progress=False)
    knob = _record(run)
    trained = [c for c in knob["candidates"] if c["samples_trained"] > 0]
    assert len(trained) == 1 and trained[0]["value"] == 2
    assert all(c["replayed"] for c in knob["candidates"] if c is not trained[0])
    assert all(0.0 <= c["validation_mean_accuracy"] <= 1.0 for c in knob["candidates"])
    assert run.manifest["scenario_resolved"]["algorithm"]["hdcfl"]["groups"] == "auto"
    # the run itself refreshes with the chosen G
    assert max(run.refresh.to_pydict()["num_groups"]) <= knob["chosen"]


def _scored_as(scores: dict[float, float], monkeypatch: pytest.MonkeyPatch, finals: dict[float, float] | None = None) -> None:
    """Candidates 'score' as given (by their IFCA cluster count), whatever they trained;
    with `finals`, whole-schedule runs (the finalists) score as those give."""
    import yaml

    from hdcfl_ray.auto_knobs import choose

    real = choose._scored

    def fake(run_dir: Path, error: str | None) -> tuple[float, int]:
        _, samples = real(run_dir, error)
        written = yaml.safe_load((run_dir / "scenario.yaml").read_text())
        clusters = float(written["algorithm"]["ifca"]["clusters"])
        finalist = "-whole-draw" in run_dir.name  # a finalist's folder (choose.py)
        return (finals[clusters] if finals is not None and finalist else scores[clusters]), samples

    monkeypatch.setattr(choose, "_scored", fake)


def test_a_choice_at_the_grids_edge_tries_the_value_beyond_it_and_is_marked_where_it_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = build_scenario(_small("ifca", {"clusters": "auto"}, partition={"num_clients": 16, "test_per_client": 20}, protocol={"rounds": 1}))
    prepared = prepare_run(scenario)
    assert prepared.auto_plan is not None

    def run(candidate: Any, run_dir: Path) -> None:
        run_simulation(prepare_run(candidate, prepared.dataset), run_dir)

    _scored_as({2: 0.2, 4: 0.3, 10: 0.5, 16: 0.6}, monkeypatch)
    (knob,) = choose_auto_knobs(scenario, prepared.auto_plan, tmp_path / "c1", lambda text: None, run).knobs
    assert knob.extended == (16,) and knob.chosen == 16 and knob.at_edge == "high"  # one model per client: nothing beyond
    _scored_as({2: 0.2, 4: 0.3, 10: 0.5, 16: 0.4}, monkeypatch)
    (knob,) = choose_auto_knobs(scenario, prepared.auto_plan, tmp_path / "c2", lambda text: None, run).knobs
    assert knob.extended == (16,) and knob.chosen == 10 and knob.at_edge is None  # inside what was tried


@pytest.mark.slow  # a long end-to-end run: the slow tier (.ci/run runs it after the README's command)
def test_a_finalists_choice_at_the_grids_edge_tries_the_value_beyond_it_as_a_finalist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    partition = {"num_clients": 16, "test_per_client": 20}
    scenario = build_scenario(_small("ifca", {"clusters": "auto"}, partition=partition, protocol={"rounds": 4}))
    prepared = prepare_run(scenario)
    assert prepared.auto_plan is not None and prepared.auto_plan.rounds == 3

    def run(candidate: Any, run_dir: Path) -> None:
        run_simulation(prepare_run(candidate, prepared.dataset), run_dir)

    # the first rung picks 4 (inside the grid); the finalists (4, 10) pick 10, the grid's edge: 16 runs both rungs
    _scored_as({2: 0.2, 4: 0.5, 10: 0.4, 16: 0.1}, monkeypatch, finals={4: 0.6, 10: 0.7, 16: 0.8})
    (knob,) = choose_auto_knobs(scenario, prepared.auto_plan, tmp_path / "c", lambda text: None, run).knobs
    assert knob.extended == (16,) and knob.chosen == 16 and knob.at_edge == "high"
    assert sorted({(f.value, f.draw) for f in knob.finalists}) == [(4, 0), (4, 1), (10, 0), (10, 1), (16, 0), (16, 1)]


def test_a_failed_candidate_is_not_cached_and_the_next_run_tries_it_again(tmp_path: Path) -> None:
    scenario = build_scenario(_small("ifca", {"clusters": "auto"}, protocol={"rounds": 1}))
    prepared = prepare_run(scenario)
    assert prepared.auto_plan is not None
    tried: list[int] = []

    def failing_once(candidate: Any, run_dir: Path) -> None:
        tried.append(candidate.algorithm.ifca.clusters)
        if candidate.algorithm.ifca.clusters == 2 and tried.count(2) == 1:
            raise RuntimeError("the machine ran out of memory")
        run_simulation(prepare_run(candidate, prepared.dataset), run_dir)

    notes: list[str] = []
    first = choose_auto_knobs(scenario, prepared.auto_plan, tmp_path / "cache", notes.append, failing_once)
    assert first.knobs[0].candidates[0].error is not None and any("not kept for the next run" in note for note in notes)
    second = choose_auto_knobs(scenario, prepared.auto_plan, tmp_path / "cache", notes.append, failing_once)
    assert not second.from_cache and tried.count(2) == 2 and second.knobs[0].candidates[0].error is None
    third = choose_auto_knobs(scenario, prepared.auto_plan, tmp_path / "cache", notes.append, failing_once)
    assert third.from_cache  # every candidate ran: kept


def test_data_regenerated_at_the_same_path_gets_a_new_choice(tmp_path: Path) -> None:
    data = tmp_path / "data"
    scenario = _small("ifca", {"clusters": "auto"}, dataset={"name": "parquet_images", "path": str(data)}, protocol={"rounds": 1})
    write_digits_parquet(data)
    first = hdcfl_ray.simulate(scenario, out=tmp_path / "first", progress=False)
    again = hdcfl_ray.simulate(scenario, out=tmp_path / "again", progress=False)
    assert again.manifest["auto_knobs"]["from_cache"] is True
    write_digits_parquet(data, shuffle_labels=True)  # the same path, the labels shuffled
    regenerated = hdcfl_ray.simulate(scenario, out=tmp_path / "regenerated", progress=False)
    assert regenerated.manifest["auto_knobs"]["from_cache"] is False
    assert regenerated.manifest["auto_knobs"]["cache"] != first.manifest["auto_knobs"]["cache"]


def test_the_cache_does_not_depend_on_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scenario = _small("ifca", {"clusters": "auto"}, protocol={"rounds": 1}, output={"dir": "runs"})
    entries = []
    for folder in ("here", "there"):
        (tmp_path / folder).mkdir()
        monkeypatch.chdir(tmp_path / folder)
        run = hdcfl_ray.simulate(scenario, out=tmp_path / folder / "run", progress=False)
        entries.append((run.manifest["auto_knobs"]["cache"], run.manifest["auto_knobs"]["from_cache"]))
    assert entries[0][0] == entries[1][0] and [cached for _, cached in entries] == [False, True]
    assert Path(entries[0][0]).is_absolute()


def test_the_runs_recorded_time_includes_its_choice(tmp_path: Path) -> None:
    run = hdcfl_ray.simulate(_small("ifca", {"clusters": "auto"}, protocol={"rounds": 1}), out=tmp_path / "run", progress=False)
    choice = run.manifest["auto_knobs"]["elapsed_s"]
    assert choice > 0 and run.manifest["auto_knobs_choice_s"] == pytest.approx(choice)
    assert run.manifest["elapsed_s"] >= choice
    assert not math.isnan(run.manifest["elapsed_s"])
