"""A report averages runs only where they are one setting: runs of one scenario name
whose resolved scenarios differ (another partition, another round count) get a column
each, named by what differs; runs of one method that differ in its own knobs get a row
each; two runs of one method, setting and seed are refused, both folders named, unless
the user says which to keep. Keys a rerun may change (checkpoints, CPUs per actor) do
not split a setting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import hdcfl_ray
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.terminal.live_view import QuietObserver
from tests.conftest import tiny_scenario


TINY_HDCFL = tiny_scenario()["algorithm"]["hdcfl"]


def simulate(root: Path, folder: str, method: str = "local", seed: int = 17, **sections: dict) -> Path:
    """A finished two-round run of the `tiny` scenario (local backend), as simulate writes it."""
    scenario = tiny_scenario(
        seed=seed,
        algorithm={"name": method, **sections.pop("algorithm", {})},
        protocol={"rounds": 2, **sections.pop("protocol", {})},
        runtime={"backend": "local", **sections.pop("runtime", {})},
        **sections,
    )
    run_dir = root / folder
    run_simulation(prepare_run(build_scenario(scenario)), run_dir, QuietObserver())
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("report-settings")
    made = {
        "rotation": simulate(root, "rotation"),
        "label_subset": simulate(root, "label_subset", partition={"kind": "label_subset", "k": 3}),
        "three_rounds": simulate(root, "three_rounds", protocol={"rounds": 3}),
        # another seed, with keys a rerun may change: the same setting as "rotation"
        "seed18_safe_keys": simulate(root, "seed18", seed=18, checkpoint={"every": 1}, runtime={"max_restarts": 1}),
        "hdcfl": simulate(root, "hdcfl", "hdcfl"),
        "hdcfl_mix0": simulate(root, "hdcfl_mix0", "hdcfl", algorithm={"hdcfl": {**TINY_HDCFL, "mix": 0.0}}),
        "repeat": simulate(root, "repeat"),  # "rotation" again, same seed
        # a variant named by output.label that also runs more rounds
        "labelled_three_rounds": simulate(root, "labelled", protocol={"rounds": 3}, output={"label": "local-long"}),
    }
    for name, started in (("rotation", "2026-01-01T00:00:00+00:00"), ("repeat", "2026-01-02T00:00:00+00:00")):
        manifest_path = made[name] / "manifest.json"  # which of the two started first, independent of the clock
        manifest_path.write_text(json.dumps({**json.loads(manifest_path.read_text()), "started_at": started}))
    return made


def report(*paths: Path, options: tuple[str, ...] = ()) -> tuple[int, str]:
    from cli import app

    result = CliRunner().invoke(app, ["report", *map(str, paths), "--format", "md", *options])
    return result.exit_code, result.output


def mean_table(markdown: str) -> str:
    return markdown.split("###")[1]


def test_runs_of_one_name_with_another_partition_are_two_columns_named_by_what_differs(runs):
    code, text = report(runs["rotation"], runs["label_subset"])
    assert code == 0, text
    table = mean_table(text)
    assert "| Method | tiny [partition.kind=label_subset, partition.k=3] | tiny [partition.kind=rotation, partition.k=null] |" in table
    assert "2 runs; seeds 17." in table  # one run in each column: nothing averaged
    assert "± " not in table.split("\n\n")[1]  # a single seed per cell has no spread


def test_runs_with_another_round_count_are_not_averaged(runs):
    code, text = report(runs["rotation"], runs["three_rounds"])
    assert code == 0, text
    assert "| Method | tiny [protocol.rounds=2] | tiny [protocol.rounds=3] |" in mean_table(text)


def test_a_changed_method_knob_is_a_row_of_its_own_named_by_the_knob(runs):
    code, text = report(runs["hdcfl"], runs["hdcfl_mix0"])
    assert code == 0, text
    table = mean_table(text)
    assert "| Method | tiny |" in table  # one setting: the knob is the method's, not the setting's
    rows = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| hdcfl")]
    assert rows == ["hdcfl", "hdcfl [mix=0.0]"]  # the defaults keep the method's name


def test_a_label_names_the_row_and_the_scenario_still_names_the_column(runs):
    code, text = report(runs["rotation"], runs["three_rounds"], runs["labelled_three_rounds"])
    assert code == 0, text
    table = mean_table(text)
    assert "| Method | tiny [protocol.rounds=2] | tiny [protocol.rounds=3] |" in table
    assert "| local-long | - |" in table  # beside Local's three-round run, not Local's two-round one


def test_two_runs_of_one_method_setting_and_seed_are_refused_naming_both_folders(runs):
    code, text = report(runs["rotation"], runs["repeat"])
    assert code == 2
    assert "tiny / local / seed 17" in text
    flat = text.replace("\n", "")
    assert str(runs["rotation"]) in flat and str(runs["repeat"]) in flat
    assert "--keep-duplicate newest" in text


@pytest.mark.parametrize(("keep", "kept", "passed_over"), [("newest", "repeat", "rotation"), ("oldest", "rotation", "repeat")])
def test_keep_duplicate_keeps_one_run_of_the_seed_and_names_the_other(runs, keep, kept, passed_over):
    code, text = report(runs["rotation"], runs["repeat"], runs["seed18_safe_keys"], options=("--keep-duplicate", keep))
    assert code == 0, text
    table = mean_table(text)
    assert "2 runs; seeds 17, 18." in table
    note = f"Left out as repeats of a seed ({keep} kept): 1 run(s): tiny/local seed 17 ({runs[passed_over]})"
    assert note in text.replace("\n", "")


def test_keys_a_rerun_may_change_leave_one_setting(runs):
    code, text = report(runs["rotation"], runs["seed18_safe_keys"])
    assert code == 0, text
    table = mean_table(text)
    assert "| Method | tiny |" in table and "2 runs; seeds 17, 18." in table


def test_a_wrong_keep_choice_is_bad_input(runs):
    code, text = report(runs["rotation"], options=("--keep-duplicate", "latest"))
    assert code == 2 and "--keep-duplicate latest: choose newest or oldest" in text


def test_the_python_report_refuses_and_keeps_as_the_command_does(runs):
    with pytest.raises(ScenarioError, match="seed 17"):
        hdcfl_ray.report([runs["rotation"], runs["repeat"]])
    with pytest.warns(UserWarning, match="Left out as repeats"):
        text = hdcfl_ray.report([runs["rotation"], runs["repeat"]], keep_duplicate="newest")
    assert "1 runs; seeds 17." in text
    split = hdcfl_ray.report([runs["rotation"], runs["label_subset"], runs["three_rounds"]])
    assert "tiny [partition.kind=label_subset, partition.k=3, protocol.rounds=2]" in split


def test_a_calibration_table_refuses_runs_that_differ_in_more_than_its_knob(runs):
    from analysis.calibration_table import calibration_table
    from analysis.runs import load_runs

    table = calibration_table(load_runs([runs["hdcfl"], runs["hdcfl_mix0"]]), "algorithm.hdcfl.mix")
    assert [row[0].value for row in table.rows] == ["0.0", "1.0"]
    with pytest.raises(ScenarioError, match="partition.kind"):
        calibration_table(load_runs([runs["rotation"], runs["label_subset"]]), "protocol.rounds")
    with pytest.raises(ScenarioError, match="more than one run of a value and seed"):
        calibration_table(load_runs([runs["rotation"], runs["repeat"]]), "protocol.rounds")


def test_a_run_of_a_plugin_method_not_loaded_here_is_still_placed_by_its_setting():
    from analysis.runs import RunRecord
    from analysis.setting_groups import run_setting

    def record(algorithm: dict) -> RunRecord:
        return RunRecord(Path("run"), tiny_scenario(algorithm=algorithm), {}, None, None, None)  # type: ignore[arg-type]

    unknown = run_setting(record({"name": "not_loaded_here", "not_loaded_here": {"note": 2}}))
    local = run_setting(record({"name": "local"}))
    assert unknown.fingerprint == local.fingerprint  # the method's section is no part of the setting
    assert unknown.knobs == {"note": 2} and unknown.default_knobs is None  # as the run wrote them


def test_replays_of_runs_in_a_column_named_by_its_keys_find_their_base():
    from analysis.final_metrics import RunMetrics
    from analysis.report_tables import variant_tables

    values = {"mean_accuracy": 0.5, "worst_accuracy": 0.4, "bottom20_accuracy": 0.4}
    records = [
        RunMetrics(setting, "hdcfl", seed, {**values, "mean_accuracy": 0.5 + shift})
        for seed in (1, 2)
        for setting, shift in (("rot [protocol.optimizer.lr=0.1]", 0.0), ("rot.mix-0 [protocol.optimizer.lr=0.1]", -0.1))
    ]
    [table] = variant_tables(records)
    assert table.title.startswith("rot [protocol.optimizer.lr=0.1]: server-side variants")
    assert [row[0].value for row in table.rows] == ["as run", "mix-0"]
    assert table.rows[1][-2].value == "-10.00 / -10.00"


def test_the_terminal_tables_keep_the_square_brackets_of_names_and_flags(runs):
    text = hdcfl_ray.report([runs["hdcfl"], runs["hdcfl_mix0"]], format="table")
    assert "hdcfl [mix=0.0]" in text  # rich markup would have taken "[mix=0.0]" for a style
