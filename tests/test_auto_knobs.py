"""Knobs a run chooses for itself (`auto`): every data-dependent knob a method declares
accepts it; the run chooses by successive halving (shortened candidate runs, then the
better half over the whole schedule on two draws) scored on held-out training images
and never reads the test set; the manifest and the report
show each choice and its cost; the choice is cached per setting, method and seed and a
resume applies the recorded one (docs/calibration.md, "auto")."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import hdcfl_ray
from hdcfl_ray.algorithms.registry import method_specs
from hdcfl_ray.auto_knobs.cache import CACHE_FOLDER, CACHE_VARIABLE, CHOICE_FILE
from hdcfl_ray.auto_knobs.plan import auto_plan, finalists, short_rounds
from hdcfl_ray.auto_knobs.selection import better_half, choose
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.config.methods import build_algorithm
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.logs.table_writer import read_table
from hdcfl_ray.runtime.driver import prepare_run, resumable_run, run_simulation
from hdcfl_ray.terminal.live_view import QuietObserver
from tests.conftest import slow_beyond, tiny_scenario
from tests.stop_observer import StopAfterRound

pytestmark = pytest.mark.auto_knobs

# every knob `hdcfl-ray calibrate` serves that a run may choose for itself (Ditto chooses per client)
EXPECTED_KNOBS = {
    "algorithm.pacfl.threshold",
    "algorithm.ifca.clusters",
    "algorithm.fedce.clusters",
    "algorithm.fedce.temperature",
    "algorithm.fedsoft.centers",
    "algorithm.fedsoft.proximal",
    "algorithm.fedprox.mu",
    "algorithm.hdcfl.groups",
}
DECLARED = [(name, knob.key) for name, spec in method_specs().items() for knob in spec.auto_knobs]


def small(tmp_path: Path, method: str, section: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """Four clients, one round: each candidate run takes about a second."""
    scenario = tiny_scenario(
        algorithm={"name": method, method: section},
        partition={"num_clients": 4, "test_per_client": 20},
        protocol={"rounds": 1},
        runtime={"backend": "local"},
        output={"dir": str(tmp_path / "runs")},
    )
    for key, value in changes.items():
        scenario[key] = {**scenario.get(key, {}), **value} if isinstance(value, dict) else value
    return scenario


def simulate(scenario: dict[str, Any], out: Path) -> hdcfl_ray.Run:
    return hdcfl_ray.simulate(scenario, out=out, progress=False)


@pytest.fixture(autouse=True)
def _cache_of_this_test(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's choices in a cache of its own: `tmp_path/cache/auto-knobs`."""
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "cache"))


def candidate_folders(root: Path) -> list[Path]:
    return sorted(path.parent for path in (root / CACHE_FOLDER).rglob("scenario.yaml"))


def test_every_knob_calibrate_serves_is_declared_auto_and_defaults_to_it() -> None:
    assert {f"algorithm.{name}.{key}" for name, key in DECLARED} == EXPECTED_KNOBS
    for name, key in DECLARED:
        field = method_specs()[name].params.model_fields[key]
        assert field.default == "auto" and "auto = " in (field.description or ""), f"{name}.{key}"


def test_the_rule_takes_the_best_score_the_first_of_equals_and_never_a_missing_one() -> None:
    assert choose([(1, 0.5), (2, 0.7), (4, 0.6)]) == 2
    assert choose([(0.001, 0.7), (0.01, 0.7), (0.1, 0.6)]) == 0.001
    assert choose([(2, math.nan), (4, 0.1)]) == 4
    assert choose([(2, math.nan)]) is None


def test_the_candidates_run_a_shortened_schedule_and_the_better_half_the_whole_one() -> None:
    assert [short_rounds(rounds) for rounds in (1, 3, 5, 10, 20, 30, 100)] == [1, 3, 3, 4, 8, 12, 40]
    assert [finalists(values) for values in (1, 2, 3, 4, 5, 9)] == [1, 2, 2, 2, 3, 5]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([0.1, 0.25, 0.5, 0.75, math.nan]), min_size=1, max_size=9))
def test_the_better_half_keeps_every_value_tied_with_its_last(scores: list[float]) -> None:
    values = [2**position for position in range(len(scores))]
    kept = better_half(list(zip(values, scores)))
    scored = {value: score for value, score in zip(values, scores) if not math.isnan(score)}
    assert kept == sorted(kept) and set(kept) <= set(scored)
    assert len(kept) >= finalists(len(scored))  # the better half, at least two
    left_out = set(scored) - set(kept)
    # nothing left out scores as high as anything kept: a tie at the cut goes on with it
    assert all(scored[out] < min(scored[value] for value in kept) for out in left_out)
    # and no more than that: the values above the cut are fewer than the better half
    if kept:
        cut = min(scored[value] for value in kept)
        assert sum(scored[value] > cut for value in kept) < finalists(len(scored))


def test_an_exact_tie_at_the_cut_sends_both_values_on() -> None:
    # FedProx at seed 67 on Dirichlet(0.1): 0.001 and 0.01 tied after 8 rounds for the last place
    assert better_half([(0.001, 0.1503), (0.01, 0.1503), (0.1, 0.1706), (1.0, 0.1036)]) == [0.001, 0.01, 0.1]
    assert better_half([(2, 0.1), (4, 0.1), (10, 0.1)]) == [2, 4, 10]  # all at chance: all go on
    assert better_half([(1, 0.5), (2, 0.7), (4, 0.6), (8, 0.4)]) == [2, 4]


@pytest.mark.parametrize(
    "method, key",
    slow_beyond(DECLARED, fast={("hdcfl", "groups"), ("pacfl", "threshold"), ("fedce", "temperature")}),
    ids=[f"{name}.{key}" for name, key in DECLARED],
)
def test_every_declared_knob_accepts_auto_and_the_run_records_its_choice(tmp_path: Path, method: str, key: str) -> None:
    run = simulate(small(tmp_path, method, {key: "auto"}), tmp_path / "run")
    record = run.manifest["auto_knobs"]
    (knob,) = record["knobs"]
    assert knob["key"] == f"algorithm.{method}.{key}" and record["from_cache"] is False
    scores = [(c["value"], c["validation_mean_accuracy"]) for c in knob["candidates"]]
    # the grid, and the value beyond its edge when the choice landed there
    assert [value for value, _ in scores] == sorted([*knob["grid"], *knob["extended"]]) and all(0.0 <= score <= 1.0 for _, score in scores)
    # rung 2: the better half of the distinct runs (at least two), each on both held-out draws
    def expected_finalists(candidates: list[dict[str, Any]]) -> list[float]:
        roots = sorted((c for c in candidates if c.get("same_run_as") is None), key=lambda c: (-c["validation_mean_accuracy"], c["value"]))
        kept = roots[: min(len(roots), max(2, math.ceil(len(roots) / 2)))]
        tied = [c for c in roots[len(kept) :] if c["validation_mean_accuracy"] == kept[-1]["validation_mean_accuracy"]]
        return sorted(c["value"] for c in [*kept, *tied])

    draws: dict[float, list[float]] = {}
    for finalist in knob["finalists"]:
        draws.setdefault(finalist["value"], []).append(finalist["validation_mean_accuracy"])
    late = knob["extended"][-1] if knob["extended"] else None  # a value beyond the finalists' edge joins them
    before = expected_finalists([c for c in knob["candidates"] if c["value"] != late])
    assert sorted(draws) in (expected_finalists(knob["candidates"]), sorted([*before, *([late] if late is not None else [])]))
    assert all(len(scores) == 2 for scores in draws.values())
    means = sorted((value, sum(scores) / 2) for value, scores in draws.items())
    root = next((c.get("same_run_as") for c in knob["candidates"] if c["value"] == knob["chosen"]), None) or knob["chosen"]
    assert root == choose(means)  # the best mean over the draws, the smaller of equals
    assert knob["samples_trained"] == sum(c["samples_trained"] for c in [*knob["candidates"], *knob["finalists"]]) > 0
    assert record["rounds"] == 1 and record["validation_fraction"] == 0.2
    # the run folder keeps `auto` as written: reruns and reports compare the scenario as written
    assert run.scenario["algorithm"][method][key] == "auto"
    assert run.manifest["scenario_resolved"]["algorithm"][method][key] == "auto"
    for candidate in knob["candidates"]:  # each candidate is a validation-scored run kept as evidence
        candidate_run = hdcfl_ray.load_run(candidate["run_dir"])
        assert candidate_run.manifest["dataset"]["scored_on"] == "validation" and candidate_run.status == "completed"
    for finalist in knob["finalists"]:  # each draw holds out its own share: draw 1 is a run of its own
        if finalist["draw"] == 1 and not finalist.get("replayed"):
            finalist_run = hdcfl_ray.load_run(finalist["run_dir"])
            assert finalist_run.scenario["partition"]["validation_draw"] == 1 and finalist_run.status == "completed"


def test_a_grid_value_the_run_cannot_use_is_skipped_with_a_note(tmp_path: Path) -> None:
    prepared = prepare_run(build_scenario(small(tmp_path, "ifca", {"clusters": "auto"})))
    assert prepared.auto_plan is not None and prepared.auto_plan.knobs[0].candidates == (2, 4)
    assert "algorithm.ifca.clusters: auto cannot use 10 (10 models for 4 clients)" in prepared.notices


def test_a_partition_that_cannot_spare_the_held_out_images_stops_before_anything_runs(tmp_path: Path) -> None:
    scenario = small(tmp_path, "ifca", {"clusters": "auto"}, partition={"kind": "iid", "num_clients": 300, "test_per_client": 1})
    with pytest.raises(ScenarioError, match=r"algorithm.ifca.clusters: auto is chosen on 0.2 of each client's training samples held out, "
                       r"which this partition cannot spare .*give it a value"):
        prepare_run(build_scenario(scenario))


def test_a_method_is_never_built_with_an_unchosen_knob(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="algorithm.ifca.clusters: auto is chosen when a run starts"):
        build_algorithm(build_scenario(small(tmp_path, "ifca", {"clusters": "auto"})))


def test_the_run_trains_with_the_chosen_value(tmp_path: Path) -> None:
    auto = simulate(small(tmp_path, "ifca", {"clusters": "auto"}, protocol={"rounds": 2}), tmp_path / "auto")
    chosen = auto.manifest["auto_knobs"]["knobs"][0]["chosen"]
    pinned = simulate(small(tmp_path, "ifca", {"clusters": chosen}, protocol={"rounds": 2}), tmp_path / "pinned")
    columns = ["round", "client_id", "accuracy", "loss", "group"]
    assert auto.clients.select(columns).to_pylist() == pinned.clients.select(columns).to_pylist()


def test_a_candidate_whose_run_fails_is_never_chosen(tmp_path: Path) -> None:
    from hdcfl_ray.auto_knobs.choose import choose_auto_knobs

    scenario = build_scenario(small(tmp_path, "ifca", {"clusters": "auto"}))
    prepared = prepare_run(scenario)

    def run(candidate: Any, run_dir: Path) -> None:
        if candidate.algorithm.ifca.clusters == 2:
            raise RuntimeError("out of memory")
        run_simulation(prepare_run(candidate, prepared.dataset), run_dir)

    assert prepared.auto_plan is not None
    (knob,) = choose_auto_knobs(scenario, prepared.auto_plan, tmp_path / "cache", lambda text: None, run).knobs
    assert knob.chosen == 4 and knob.candidates[0].error == "RuntimeError: out of memory"
    assert math.isnan(knob.candidates[0].validation_mean_accuracy)


def test_the_choice_never_reads_the_test_set(tmp_path: Path) -> None:
    """Test labels scrambled and test images blanked: the same candidates score the same."""
    scores = {}
    for variant in ("as loaded", "test set scrambled"):
        scenario = build_scenario(small(tmp_path / variant, "fedprox", {"mu": "auto"}))
        prepared = prepare_run(scenario)
        if variant != "as loaded":
            dataset = prepared.dataset
            rng = np.random.default_rng(0)
            scrambled = dataclasses.replace(
                dataset, test_labels=rng.permutation(dataset.test_labels), test_images=np.zeros_like(dataset.test_images)
            )
            prepared = prepare_run(scenario, scrambled)
        run_simulation(prepared, tmp_path / variant / "run")
        record = json.loads((tmp_path / variant / "run" / "manifest.json").read_text())["auto_knobs"]
        scores[variant] = [(c["value"], c["validation_mean_accuracy"]) for c in record["knobs"][0]["candidates"]]
    assert scores["as loaded"] == scores["test set scrambled"]


def test_a_second_run_of_the_setting_and_seed_reads_the_cache_and_another_seed_or_setting_does_not(tmp_path: Path) -> None:
    first = simulate(small(tmp_path, "ifca", {"clusters": "auto"}), tmp_path / "first")
    made = candidate_folders(tmp_path / "cache")
    notices: list[str] = []

    class Notices(QuietObserver):
        def on_notice(self, text: str) -> None:
            notices.append(text)

    # another name and other rerun-safe keys: the same setting
    again = build_scenario(small(tmp_path, "ifca", {"clusters": "auto"}, name="renamed", checkpoint={"every": 1}))
    run_simulation(prepare_run(again), tmp_path / "again", Notices())
    record = json.loads((tmp_path / "again" / "manifest.json").read_text())["auto_knobs"]
    assert record["from_cache"] is True and record["knobs"] == first.manifest["auto_knobs"]["knobs"]
    assert candidate_folders(tmp_path / "cache") == made  # nothing trained again
    assert any("chosen earlier for this setting, data, code and seed" in notice for notice in notices)

    other_seed = simulate(small(tmp_path, "ifca", {"clusters": "auto"}, seed=8), tmp_path / "seed8")
    other_setting = simulate(small(tmp_path, "ifca", {"clusters": "auto"}, protocol={"local_epochs": 2}), tmp_path / "epochs2")
    assert other_seed.manifest["auto_knobs"]["from_cache"] is False and other_setting.manifest["auto_knobs"]["from_cache"] is False
    entries = {Path(run.manifest["auto_knobs"]["cache"]) for run in (first, other_seed, other_setting)}
    assert len(entries) == 3 and all((entry / CHOICE_FILE).is_file() for entry in entries)


def test_deleting_the_cache_entry_chooses_again(tmp_path: Path) -> None:
    first = simulate(small(tmp_path, "ifca", {"clusters": "auto"}), tmp_path / "first")
    entry = Path(first.manifest["auto_knobs"]["cache"])
    (entry / CHOICE_FILE).unlink()
    again = simulate(small(tmp_path, "ifca", {"clusters": "auto"}), tmp_path / "again")
    # the candidates' completed runs are reused, so the choice is the same without training again
    assert again.manifest["auto_knobs"]["from_cache"] is False
    assert again.manifest["auto_knobs"]["knobs"] == first.manifest["auto_knobs"]["knobs"]


def test_a_resume_applies_the_recorded_choice_and_never_chooses_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scenario = small(tmp_path, "ifca", {"clusters": "auto"}, protocol={"rounds": 3}, checkpoint={"every": 1})
    whole = simulate(scenario, tmp_path / "whole")
    run_dir = tmp_path / "stopped"
    with pytest.raises(KeyboardInterrupt):
        run_simulation(prepare_run(build_scenario(scenario)), run_dir, StopAfterRound(2))
    recorded = json.loads((run_dir / "manifest.json").read_text())["auto_knobs"]

    import hdcfl_ray.auto_knobs.choose as choose_module

    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a resume chose its auto knobs again")

    monkeypatch.setattr(choose_module, "choose_auto_knobs", never)
    run_simulation(prepare_run(resumable_run(run_dir)), run_dir, resume=True)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "completed" and manifest["auto_knobs"] == recorded
    columns = ["round", "client_id", "accuracy", "loss"]
    assert read_table(run_dir, "clients").select(columns).to_pylist() == whole.clients.select(columns).to_pylist()


def test_a_resume_without_a_recorded_choice_is_refused(tmp_path: Path) -> None:
    scenario = small(tmp_path, "ifca", {"clusters": "auto"}, protocol={"rounds": 3}, checkpoint={"every": 1})
    run_dir = tmp_path / "stopped"
    with pytest.raises(KeyboardInterrupt):
        run_simulation(prepare_run(build_scenario(scenario)), run_dir, StopAfterRound(2))
    manifest = json.loads((run_dir / "manifest.json").read_text())
    del manifest["auto_knobs"]
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    for state in run_dir.glob("checkpoint*/state.json"):
        document = json.loads(state.read_text())
        document.pop("auto_knobs", None)
        state.write_text(json.dumps(document))
    with pytest.raises(ScenarioError, match="algorithm.ifca.clusters are auto, and neither the manifest nor a checkpoint"):
        run_simulation(prepare_run(resumable_run(run_dir)), run_dir, resume=True)


def test_the_report_shows_each_choice_its_scores_and_its_cost(tmp_path: Path) -> None:
    made = simulate(small(tmp_path, "fedce", {"clusters": "auto", "temperature": "auto"}), tmp_path / "made")
    cached = simulate(small(tmp_path, "fedce", {"clusters": "auto", "temperature": "auto"}, seed=7, name="again"), tmp_path / "cached")
    text = hdcfl_ray.report([made.dir, cached.dir], format="md")
    assert "### Knobs the runs chose for themselves (auto)" in text
    record = made.manifest["auto_knobs"]
    clusters, temperature = record["knobs"]
    assert clusters["held"] == {"algorithm.fedce.temperature": 4.0}  # its placeholder while S is chosen
    assert temperature["held"] == {"algorithm.fedce.clusters": clusters["chosen"]}  # T is chosen at the chosen S
    rows = [line for line in text.splitlines() if line.startswith("| fedce |")]
    table_rows = [row for row in rows if "| clusters" in row or "| temperature" in row]
    assert len(table_rows) == 4  # two runs x two knobs
    first = next(row for row in table_rows if "| temperature (at clusters" in row and "cached" not in row)
    for candidate in temperature["candidates"]:
        assert f"{candidate['value']:g}: {100 * candidate['validation_mean_accuracy']:.2f}" in first
    for value in {finalist["value"] for finalist in temperature["finalists"]}:  # each finalist's mean over the draws
        scores = [f["validation_mean_accuracy"] for f in temperature["finalists"] if f["value"] == value]
        assert f"{value:g}: {100 * sum(scores) / len(scores):.2f} ({100 * scores[0]:.2f} / {100 * scores[1]:.2f})" in first
    assert f"**{temperature['chosen']:g}" in first and f"{temperature['samples_trained']:,}" in first
    assert sum("read from the cache" in row for row in table_rows) == 2
    # the candidate runs are evidence: a report of the folders above them leaves them out
    from analysis.runs import find_run_dirs

    assert find_run_dirs([tmp_path]) == sorted([made.dir, cached.dir])
    # 2 values of S, 3 of T, and the finalists' second draws (their first is rung 1's: one round is never shortened)
    assert len(find_run_dirs([tmp_path / "cache" / CACHE_FOLDER])) == 5 + len(clusters["finalists"]) // 2 + len(temperature["finalists"]) // 2


def test_validate_says_which_knobs_are_auto_and_what_the_choice_will_run(tmp_path: Path, write_scenario) -> None:
    from typer.testing import CliRunner

    from cli import app

    path = write_scenario(small(tmp_path, "fedsoft", {"centers": "auto", "proximal": "auto"}))
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "algorithm.fedsoft.proximal: auto: chosen before the run among 0.001, 0.01, 0.1" in result.output
    assert "algorithm.fedsoft.centers: auto: chosen before the run among 2, 4 (10 skipped)" in result.output
    # rung 1: 3 + 2 values; rung 2: two finalists each, on their second draw (one round is never shortened)
    assert "9 candidate run(s) before the run" in result.output
    assert not (tmp_path / "runs").exists()  # nothing ran


def test_the_memory_check_counts_the_largest_candidate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import hdcfl_ray.runtime.machine_checks as checks

    scenario = build_scenario(small(tmp_path, "ifca", {"clusters": "auto"}))
    monkeypatch.setattr(checks, "machine_memory_bytes", lambda: 1)
    with pytest.raises(ScenarioError, match=r"and 10 from algorithm.ifca.clusters"):
        checks.check_model_memory(scenario.model, 1, scenario.algorithm)


def test_a_sweep_chooses_once_per_setting_method_and_seed(tmp_path: Path, write_scenario, ray_session: None) -> None:
    from hdcfl_ray.sweeps.grid import SweepPlan, expand
    from hdcfl_ray.sweeps.runner import run_sweep

    # two scenario files of one setting (they differ only in their names and in another method's section)
    first = write_scenario(small(tmp_path, "ifca", {"clusters": "auto"}, name="one"), "one.yaml")
    other = small(tmp_path, "ifca", {"clusters": "auto"}, name="two")
    other["algorithm"]["hdcfl"] = {"groups": 3}
    second = write_scenario(other, "two.yaml")
    out = tmp_path / "sweep"
    runs = expand(SweepPlan((first, second), None, None, (), out))
    outcome = run_sweep(runs, out, build_scenario(yaml.safe_load(first.read_text())).runtime, parallel=1)
    assert sorted(outcome.completed) == ["one/ifca/seed7", "two/ifca/seed7"]
    records = [json.loads((run.run_dir / "manifest.json").read_text())["auto_knobs"] for run in runs]
    assert [record["from_cache"] for record in records] == [False, True]
    assert Path(records[0]["cache"]).parent == out / CACHE_FOLDER
    assert auto_plan(runs[0].scenario) is not None


SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


# HDC-FL's G: the paper fixes G = 4 in all its settings, so its scenario files (and their
# CPU-sized versions) keep 4; every other scenario lets the run choose it
PAPER_G = ("hdcfl", "groups")


@pytest.mark.parametrize("path", ["quickstart.yaml", "cpu/cpu-c10-rot.yaml", "cpu/cpu-c10-ls3.yaml"])
def test_the_calibrated_scenarios_pin_every_knob_a_run_could_choose(path: str) -> None:
    """Their values were chosen by `hdcfl-ray calibrate` (docs/calibration.md) and their
    published tables (and the quickstart's pinned bits) were made with them."""
    algorithm = yaml.safe_load((SCENARIOS / path).read_text())["algorithm"]
    for name, key in DECLARED:
        if (name, key) == PAPER_G and not path.startswith("cpu/"):
            assert algorithm[name][key] == "auto", f"{path}: HDC-FL's G is chosen like its rivals' knobs outside the paper's settings"
            continue
        assert algorithm.get(name, {}).get(key, "auto") != "auto", f"{path}: algorithm.{name}.{key}"


@pytest.mark.parametrize("path", ["paper/c10-ls3.yaml", "cpu/cpu-c10-a0.07.yaml", "auto/digits-ls3.yaml"])
def test_the_uncalibrated_scenarios_leave_every_such_knob_to_the_run(path: str) -> None:
    algorithm = yaml.safe_load((SCENARIOS / path).read_text())["algorithm"]
    for name, key in DECLARED:
        if (name, key) == PAPER_G and path.startswith(("paper/", "cpu/")):
            assert algorithm[name][key] == 4, f"{path}: the paper's G"
            continue
        assert algorithm.get(name, {}).get(key, "auto") == "auto", f"{path}: algorithm.{name}.{key}"
