"""protocol.eval_clients: a seeded sample of clients scored at every evaluated round,
recorded in the tables and the manifest, and marked in every report format."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from analysis.final_metrics import RunMetrics, run_metrics
from analysis.report_tables import all_tables, to_csv, to_latex, to_markdown
from analysis.runs import load_run
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.logs.table_writer import read_table
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.runtime.server.sampling import evaluation_sample
from hdcfl_ray.terminal.live_view import QuietObserver
from tests.conftest import tiny_scenario


def test_all_is_every_client_in_id_order() -> None:
    assert evaluation_sample(6, "all", seed=1) == tuple(range(6))


@pytest.mark.parametrize("seed", [1, 7, 2026])
def test_a_count_or_fraction_draws_a_sorted_sample_fixed_by_the_seed(seed: int) -> None:
    sample = evaluation_sample(1000, 25, seed)
    assert len(sample) == 25 == len(set(sample)) and list(sample) == sorted(sample)
    assert evaluation_sample(1000, 25, seed) == sample
    assert evaluation_sample(1000, 0.1, seed) == evaluation_sample(1000, 100, seed)
    assert evaluation_sample(1000, 25, seed + 1) != sample
    assert evaluation_sample(10, 10, seed) == tuple(range(10))
    assert len(evaluation_sample(10, 0.01, seed)) == 1  # never an empty sample


@pytest.mark.parametrize(
    ("value", "words"),
    [(0, "count of clients >= 1"), (1.5, "fraction in (0, 1]"), (True, "all, a fraction"), (50, "more than partition.num_clients")],
)
def test_bad_values_name_the_key_and_the_choices(value: object, words: str) -> None:
    with pytest.raises((ScenarioError, ValueError)) as raised:
        build_scenario(tiny_scenario(protocol={"eval_clients": value}))
    assert "eval_clients" in str(raised.value) and words in str(raised.value)


@pytest.fixture(scope="module")
def sampled_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    scenario = build_scenario(
        tiny_scenario(algorithm={"name": "fedavg_se"}, protocol={"rounds": 2, "eval_clients": 3}, runtime={"backend": "local"})
    )
    run_dir = tmp_path_factory.mktemp("sampled") / "run"
    run_simulation(prepare_run(scenario), run_dir, QuietObserver())
    return run_dir


def test_every_evaluated_round_scores_the_same_sample(sampled_run: Path) -> None:
    clients = read_table(sampled_run, "clients").to_pydict()
    expected = list(evaluation_sample(8, 3, seed=7))
    for round_index in (1, 2):
        scored = sorted(k for r, k in zip(clients["round"], clients["client_id"]) if r == round_index)
        assert scored == expected
    rounds = read_table(sampled_run, "rounds").to_pydict()
    assert rounds["num_evaluated"] == [3, 3]
    manifest = json.loads((sampled_run / "manifest.json").read_text())
    assert manifest["evaluation"] == {"clients_scored": 3, "num_clients": 8, "sampled": True}


def test_the_report_marks_a_sampled_run_in_every_format(sampled_run: Path) -> None:
    (record,) = run_metrics([load_run(sampled_run)])
    assert record.values["evaluated_fraction"] == pytest.approx(3 / 8)
    full = RunMetrics(record.setting, "local", record.seed, {**record.values, "evaluated_fraction": 1.0})
    for render in (to_markdown, to_csv, to_latex):
        text = render(all_tables([record, full])).replace("\\%", "%")  # LaTeX escapes the percent sign
        assert "sampled evaluation (37.5% of the clients)" in text, render.__name__
        assert "seeded sample of the clients" in text or render is to_csv


def test_a_full_evaluation_is_not_marked() -> None:
    values = {"mean_accuracy": 0.5, "worst_accuracy": 0.3, "evaluated_fraction": 1.0, "num_groups": math.nan, "ari_true": math.nan}
    text = to_markdown(all_tables([RunMetrics("rot", "fedavg", 1, values)]))
    assert "sampled evaluation" not in text


def test_a_run_with_newcomers_is_not_marked_as_a_sampled_evaluation(tmp_path: Path) -> None:
    """Newcomers are scored in their own table, never among the evaluated clients: a run
    that scores every client that trains is a whole evaluation."""
    scenario = build_scenario(tiny_scenario(algorithm={"name": "fedavg"}, partition={"newcomers": 2}, protocol={"rounds": 1}, runtime={"backend": "local"}))
    run_dir = tmp_path / "run"
    run_simulation(prepare_run(scenario), run_dir, QuietObserver())
    (record,) = run_metrics([load_run(run_dir)])
    assert record.values["evaluated_fraction"] == 1.0
    assert "sampled evaluation" not in to_markdown(all_tables([record]))
