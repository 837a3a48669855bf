"""A method variant named by `output.label` is its own row beside the method, paired by
seed with every other method; `report --against` chooses the method the paired table
compares the others with."""

from __future__ import annotations

import math

import pytest
from typer.testing import CliRunner

from analysis.final_metrics import RunMetrics
from analysis.paired_table import paired_table
from analysis.report_tables import all_tables, to_markdown
from analysis.runs import method_label
from cli import app
from tests.conftest import tiny_scenario

runner = CliRunner()


def test_a_label_names_the_row_and_an_unlabelled_run_keeps_its_method():
    assert method_label({"algorithm": {"name": "fedbabu"}, "output": {"label": "fedbabu-ft20"}}) == "fedbabu-ft20"
    assert method_label({"algorithm": {"name": "fedbabu"}, "output": {"label": None}}) == "fedbabu"
    assert method_label({"algorithm": {"name": "fedsoft", "fedsoft": {"selection_mode": "all_clients"}}}) == "fedsoft-all"


def _record(method: str, seed: int, mean: float) -> RunMetrics:
    values = {"mean_accuracy": mean, "worst_accuracy": mean - 0.1, "bottom20_accuracy": mean - 0.05, "gap": 0.2, "ari_true": math.nan}
    return RunMetrics("rot", method, seed, values)


def test_against_pairs_every_method_with_the_chosen_one_seed_by_seed():
    records = [
        *(_record("fedavg_se", seed, mean) for seed, mean in ((1, 0.60), (2, 0.62), (3, 0.61))),
        *(_record("fedbabu", seed, mean) for seed, mean in ((1, 0.57), (2, 0.60), (3, 0.58))),
        *(_record("fedbabu-ft20", seed, mean) for seed, mean in ((1, 0.59), (2, 0.63), (3, 0.60))),
    ]
    table = paired_table(records, "fedavg_se")
    rows = {row[1].value: [cell.value for cell in row] for row in table.rows}
    assert table.title.startswith("Paired differences: fedavg_se minus each method")
    assert rows["fedbabu"][3] == "+3.00 / +2.00 / +3.00" and rows["fedbabu"][-1].startswith("ahead")
    assert rows["fedbabu-ft20"][3] == "+1.00 / -1.00 / +1.00" and rows["fedbabu-ft20"][-1].startswith("indistinguishable")
    assert "fedavg_se minus each method" in to_markdown(all_tables(records, "fedavg_se"))
    assert paired_table(records) is None  # no hdcfl run: the default reference is absent, no paired table


@pytest.fixture(scope="module")
def labelled_runs(tmp_path_factory):
    from hdcfl_ray.config.loading import build_scenario
    from hdcfl_ray.runtime.driver import prepare_run, run_simulation
    from hdcfl_ray.terminal.live_view import QuietObserver

    root = tmp_path_factory.mktemp("labelled")
    for label in (None, "fedprox-mu1"):
        changes = {"protocol": {"rounds": 1}, "runtime": {"backend": "local"}, "algorithm": {"name": "fedprox"}}
        if label is not None:  # a variant in the method's own knobs: the same setting, a row of its own
            changes["output"] = {"label": label}
            changes["algorithm"]["fedprox"] = {"mu": 1.0}
        run_simulation(prepare_run(build_scenario(tiny_scenario(**changes))), root / (label or "plain"), QuietObserver())
    return root


def test_the_report_lists_a_labelled_run_under_its_label_and_against_picks_the_reference(labelled_runs):
    result = runner.invoke(app, ["report", str(labelled_runs), "--format", "md", "--against", "fedprox"])
    assert result.exit_code == 0, result.output
    assert "| fedprox-mu1 |" in result.output and "fedprox minus each method" in result.output


def test_against_a_method_without_runs_exits_2_naming_the_methods_there(labelled_runs):
    result = runner.invoke(app, ["report", str(labelled_runs), "--against", "fedavg_se"])
    assert result.exit_code == 2, result.output
    assert "'fedavg_se'" in result.output and "fedprox, fedprox-mu1" in result.output and "Traceback" not in result.output


def test_a_label_with_spaces_is_refused_naming_the_key():
    from hdcfl_ray.config.loading import build_scenario
    from hdcfl_ray.errors import ScenarioError

    with pytest.raises(ScenarioError, match="output.label"):
        build_scenario(tiny_scenario(output={"label": "my variant"}))


def test_a_sweep_refuses_one_label_for_several_methods(write_scenario, tmp_path):
    path = write_scenario(tiny_scenario(output={"label": "variant"}))
    result = runner.invoke(app, ["sweep", str(path), "--algorithms", "fedavg,local", "--out", str(tmp_path / "sweep")])
    assert result.exit_code == 2, result.output
    assert "output.label 'variant'" in result.output and "fedavg, local" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "sweep").exists()


def test_the_python_report_takes_against_as_the_cli_does(labelled_runs):
    import hdcfl_ray
    from hdcfl_ray.errors import ScenarioError

    assert "fedprox minus each method" in hdcfl_ray.report(labelled_runs, against="fedprox")
    with pytest.raises(ScenarioError, match="fedprox, fedprox-mu1"):
        hdcfl_ray.report(labelled_runs, against="hdcfl")
