"""A kept choice is evidence, checked before a run takes it: a choice file edited by hand
(a value that lost, one never tried, a word instead of a number), one whose scores no
longer agree with its candidate runs, one whose runs are gone, and one that is not JSON
at all are each reported, naming the file and what is wrong, and made again; a genuine
choice passes (tests/conftest.py checks every choice the tests make as it is kept)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from hdcfl_ray.auto_knobs.cache import CACHE_FOLDER, CACHE_VARIABLE, CHOICE_FILE
from hdcfl_ray.auto_knobs.evidence import expected_choice, record_problems
from hdcfl_ray.auto_knobs.record import AutoKnobsRecord, Candidate, KnobChoice
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.terminal.live_view import QuietObserver
from tests.conftest import tiny_scenario

pytestmark = pytest.mark.auto_knobs

SCENARIO = tiny_scenario(
    algorithm={"name": "ifca", "ifca": {"clusters": "auto"}},
    partition={"num_clients": 4, "test_per_client": 20},
    protocol={"rounds": 2},
    runtime={"backend": "local"},
)


class Notices(QuietObserver):
    def __init__(self) -> None:
        self.notices: list[str] = []

    def on_notice(self, text: str) -> None:
        self.notices.append(text)


def _run(run_dir: Path) -> tuple[dict[str, Any], list[str]]:
    observer = Notices()
    run_simulation(prepare_run(build_scenario(SCENARIO)), run_dir, observer)
    return json.loads((run_dir / "manifest.json").read_text())["auto_knobs"], observer.notices


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """One genuine choice (IFCA's cluster count, two rounds, four clients) in a cache of its own."""
    cache = tmp_path_factory.mktemp("made")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_VARIABLE, str(cache / "cache"))
        record, _ = _run(cache / "run")
    assert record["from_cache"] is False
    return cache / "cache", record


@pytest.fixture
def cache(made: tuple[Path, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the genuine choice's cache for this test to tamper with."""
    copy = tmp_path / "cache"
    shutil.copytree(made[0], copy)
    monkeypatch.setenv(CACHE_VARIABLE, str(copy))
    return copy


def _choice_file(cache: Path) -> Path:
    (path,) = (cache / CACHE_FOLDER).glob(f"*/{CHOICE_FILE}")
    return path


def _edit(cache: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    path = _choice_file(cache)
    document = json.loads(path.read_text())
    change(document["record"]["knobs"][0])
    path.write_text(json.dumps(document, indent=2))
    return path


def _losing_value(knob: dict[str, Any]) -> Any:
    return next(c["value"] for c in knob["candidates"] if c["value"] != knob["chosen"])


def _rechosen(cache: Path, tmp_path: Path, made: tuple[Path, dict[str, Any]], expected: str) -> list[str]:
    """A run with the tampered entry: it does not take the kept value, says why (naming the
    file), makes the same choice again, and keeps it for the next run."""
    record, notices = _run(tmp_path / "run")
    said = [notice for notice in notices if "is not used" in notice]
    assert said and str(_choice_file(cache)) in said[0] and expected in said[0], notices
    assert record["from_cache"] is False
    assert record["knobs"][0]["chosen"] == made[1]["knobs"][0]["chosen"]
    again, _ = _run(tmp_path / "again")
    assert again["from_cache"] is True and again["knobs"][0]["chosen"] == made[1]["knobs"][0]["chosen"]
    return said


def test_a_genuine_choice_is_taken_from_the_cache(cache: Path, tmp_path: Path) -> None:
    record, notices = _run(tmp_path / "run")
    assert record["from_cache"] is True and not [n for n in notices if "is not used" in n]


def test_a_chosen_value_that_lost_is_not_used(cache: Path, tmp_path: Path, made: tuple[Path, dict[str, Any]]) -> None:
    _edit(cache, lambda knob: knob.update(chosen=_losing_value(knob)))
    _rechosen(cache, tmp_path, made, "but the rule picks")


def test_a_chosen_value_never_tried_is_not_used(cache: Path, tmp_path: Path, made: tuple[Path, dict[str, Any]]) -> None:
    _edit(cache, lambda knob: knob.update(chosen=3))
    _rechosen(cache, tmp_path, made, "chosen 3 was never tried")


def test_a_word_where_a_value_belongs_is_not_used(cache: Path, tmp_path: Path, made: tuple[Path, dict[str, Any]]) -> None:
    _edit(cache, lambda knob: knob.update(chosen="banana"))
    _rechosen(cache, tmp_path, made, "'banana' is not a number")


def test_scores_edited_to_make_another_value_win_disagree_with_its_run(cache: Path, tmp_path: Path, made: tuple[Path, dict[str, Any]]) -> None:
    """Stale or forged scores: the record is consistent with the rule, but not with the runs kept beside it."""

    def forge(knob: dict[str, Any]) -> None:
        loser = _losing_value(knob)
        knob["chosen"] = loser
        for run in (*knob["candidates"], *knob["finalists"]):
            if run["value"] == loser:
                run["validation_mean_accuracy"] = 1.0

    _edit(cache, forge)
    _rechosen(cache, tmp_path, made, "but its run folder")


def test_a_choice_whose_candidate_runs_are_gone_is_not_used(cache: Path, tmp_path: Path, made: tuple[Path, dict[str, Any]]) -> None:
    entry = _choice_file(cache).parent
    for folder in entry.iterdir():
        if folder.is_dir():
            shutil.rmtree(folder)
    _rechosen(cache, tmp_path, made, "is missing or unfinished")


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"key": ', "not valid JSON"),
        ("[1, 2]", "not a choice file"),
        (None, "its record is malformed"),
    ],
)
def test_a_malformed_choice_file_is_reported_and_made_again(
    cache: Path, tmp_path: Path, made: tuple[Path, dict[str, Any]], text: str | None, expected: str
) -> None:
    path = _choice_file(cache)
    if text is None:  # the right shape, a wrong type inside
        document = json.loads(path.read_text())
        document["record"]["rounds"] = "many"
        text = json.dumps(document)
    path.write_text(text)
    _rechosen(cache, tmp_path, made, expected)


def test_validate_says_a_forged_choice_will_not_be_used(cache: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cli import app

    path = _edit(cache, lambda knob: knob.update(chosen=3))
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    result = CliRunner().invoke(app, ["validate", str(scenario)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "is not used" in text and str(path) in text.replace(" ", "")
    assert "chosen 3 was never tried" in text and "chosen before for this setting" not in text and result.exception is None


# ---- the rule read back from a record --------------------------------------------------------------


def _knob(scores: dict[int, float], finals: dict[int, list[float]], chosen: int, twins: dict[int, int] | None = None) -> KnobChoice:
    twins = twins or {}
    candidates = tuple(
        Candidate(value, scores[twins.get(value, value)], 0, f"clusters-{value}", same_run_as=twins.get(value)) for value in sorted(scores)
    )
    finalists = tuple(
        Candidate(value, score, 0, f"clusters-{value}-whole-draw{draw}", draw=draw) for value, draws in finals.items() for draw, score in enumerate(draws)
    )
    return KnobChoice("algorithm.ifca.clusters", tuple(sorted(scores)), {}, {}, candidates, chosen, finalists=finalists)


def test_the_finalists_mean_decides_not_rung_one() -> None:
    knob = _knob({2: 0.9, 4: 0.8, 8: 0.1}, {2: [0.5, 0.5], 4: [0.6, 0.6]}, chosen=4)
    assert expected_choice(knob) == 4
    record = AutoKnobsRecord("ifca", "rule", 1, 2, 0.2, (knob,), "", False, 0.0)
    problems = record_problems(record, Path("/nonexistent"))
    assert problems and all("run folder" in problem for problem in problems)  # the rule holds; the runs are not there


def test_values_that_gave_the_same_run_choose_the_middle_one() -> None:
    knob = _knob({1: 0.5, 2: 0.5, 3: 0.5, 8: 0.4}, {}, chosen=2, twins={2: 1, 3: 1})
    assert expected_choice(knob) == 2


@settings(max_examples=60, deadline=None)
@given(
    scores=st.lists(st.one_of(st.floats(0, 1), st.just(math.nan)), min_size=2, max_size=6),
    finals=st.lists(st.floats(0, 1), min_size=0, max_size=4),
)
def test_only_the_value_the_rule_picks_passes(scores: list[float], finals: list[float]) -> None:
    values = [2 * (index + 1) for index in range(len(scores))]
    by_value = dict(zip(values, scores))
    finalists = {value: [score, score] for value, score in zip(values, finals)}
    picked = expected_choice(_knob(by_value, finalists, chosen=values[0]))
    for chosen in values:
        record = AutoKnobsRecord("ifca", "rule", 1, 2, 0.2, (_knob(by_value, finalists, chosen),), "", False, 0.0)
        rule_problems = [p for p in record_problems(record, Path("/nonexistent")) if "run folder" not in p]
        assert (rule_problems == []) == (picked is not None and chosen == picked)
