"""The commands that rebuild a method from a finished run (`ablate`, `diagnose
donor-swap`, `simulate --resume`) on a run whose knobs were `auto` (the quickstart's
default): they take the values the run recorded choosing, a value given on the
command line wins, and a user's mistake is an `error:` line with exit 2, never a
traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import Result
from typer.testing import CliRunner

import hdcfl_ray
from cli import app
from hdcfl_ray.config.loading import load_scenario
from hdcfl_ray.logs.table_writer import read_table
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from tests.stop_observer import StopAfterRound

pytestmark = pytest.mark.auto_knobs

QUICKSTART = Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.yaml"
GROUPS = "algorithm.hdcfl.groups"
# The quickstart as written (G `auto`, the first refresh at 20% of the rounds), shrunk
# to seconds: 8 clients, 4 rounds, a refresh every round, its refreshes kept.
SHRUNK = {
    "protocol.rounds": 4,
    "protocol.local_epochs": 1,
    "partition.num_clients": 8,
    "partition.test_per_client": 20,
    "algorithm.hdcfl.refresh_every": 1,
    "output.save_refresh_cache": True,
}


@pytest.fixture(scope="module")
def auto_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished quickstart run whose G the run chose for itself."""
    run = hdcfl_ray.simulate(QUICKSTART, overrides=SHRUNK, out=tmp_path_factory.mktemp("auto-run") / "run", progress=False)
    assert run.scenario["algorithm"]["hdcfl"]["groups"] == "auto"
    return run.dir


def chosen_groups(run_dir: Path) -> int:
    return int(json.loads((run_dir / "manifest.json").read_text())["auto_knobs"]["knobs"][0]["chosen"])


def invoke(*args: Any) -> Result:
    """The command, in this process; whatever it ends with, never a traceback."""
    result = CliRunner().invoke(app, [str(arg) for arg in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    return result


def refused(result: Result, *named: str) -> None:
    assert result.exit_code == 2, result.output
    assert "error:" in result.output and all(text in result.output for text in named), result.output


def groups_and_memberships(run_dir: Path, rounds: set[int]) -> list[tuple[Any, ...]]:
    """Each scored client's group, memberships and personalised accuracy at these rounds."""
    rows = read_table(run_dir, "clients").to_pylist()
    return sorted(
        (row["round"], row["client_id"], row["group"], row["memberships"], row["accuracy_personalized"])
        for row in rows
        if row["round"] in rounds and row["group"] is not None
    )


def test_ablate_with_no_override_replays_the_runs_own_refreshes(auto_run: Path, tmp_path: Path) -> None:
    result = invoke("ablate", auto_run, "--out", tmp_path / "same")
    assert result.exit_code == 0, result.output
    replayed = tmp_path / "same"
    # every refresh as the run logged it: its G, groups, silhouettes; each client's group and membership
    refreshes = read_table(auto_run, "refresh").to_pylist()
    assert read_table(replayed, "refresh").to_pylist() == refreshes
    refresh_rounds = {row["round"] for row in refreshes}
    assert groups_and_memberships(replayed, refresh_rounds) == groups_and_memberships(auto_run, refresh_rounds)
    assert groups_and_memberships(replayed, refresh_rounds)
    written = yaml.safe_load((replayed / "scenario.yaml").read_text())
    assert written["algorithm"]["hdcfl"]["groups"] == chosen_groups(auto_run)


def test_an_override_on_the_command_line_wins_over_the_recorded_choice(auto_run: Path, tmp_path: Path) -> None:
    other = 2 if chosen_groups(auto_run) != 2 else 3
    result = invoke("ablate", auto_run, "--set", f"{GROUPS}={other}", "--out", tmp_path / "other")
    assert result.exit_code == 0, result.output
    assert {row["num_groups"] for row in read_table(tmp_path / "other", "refresh").to_pylist()} == {other}
    assert yaml.safe_load((tmp_path / "other" / "scenario.yaml").read_text())["algorithm"]["hdcfl"]["groups"] == other


def test_another_server_side_change_keeps_the_recorded_groups(auto_run: Path, tmp_path: Path) -> None:
    result = invoke("ablate", auto_run, "--set", "algorithm.hdcfl.mix=0", "--out", tmp_path / "mix0")
    assert result.exit_code == 0, result.output
    logged = [row["num_groups"] for row in read_table(auto_run, "refresh").to_pylist()]
    assert [row["num_groups"] for row in read_table(tmp_path / "mix0", "refresh").to_pylist()] == logged


@pytest.mark.usefixtures("ray_session")
def test_donor_swap_runs_on_an_auto_run(auto_run: Path) -> None:
    result = invoke("diagnose", "donor-swap", auto_run, "--max-test-samples", 8)
    assert result.exit_code == 0, result.output
    assert "Donor swap (8 target units)" in result.output


def without_recorded_choice(auto_run: Path, folder: Path) -> Path:
    """A copy of the run whose manifest no longer says what it chose."""
    shutil.copytree(auto_run, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    del manifest["auto_knobs"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_an_auto_knob_with_no_recorded_choice_is_refused_naming_it_and_the_fix(auto_run: Path, tmp_path: Path) -> None:
    run_dir = without_recorded_choice(auto_run, tmp_path / "unrecorded")
    refused(invoke("ablate", run_dir, "--set", "algorithm.hdcfl.mix=0", "--out", tmp_path / "out"), GROUPS, f"--set {GROUPS}=VALUE")
    assert not (tmp_path / "out").exists()  # refused before anything is written
    refused(invoke("diagnose", "donor-swap", run_dir), GROUPS, "manifest.json")
    # given on the command line, the value needs no record
    assert invoke("ablate", run_dir, "--set", f"{GROUPS}=2", "--out", tmp_path / "given").exit_code == 0


def test_a_missing_or_damaged_manifest_is_refused_naming_the_file(auto_run: Path, tmp_path: Path) -> None:
    missing = tmp_path / "no-manifest"
    shutil.copytree(auto_run, missing)
    (missing / "manifest.json").unlink()
    refused(invoke("ablate", missing, "--out", tmp_path / "out"), GROUPS, "no manifest.json")
    (missing / "manifest.json").write_text("{trunc")
    refused(invoke("ablate", missing, "--out", tmp_path / "out"), "manifest.json", f"--set {GROUPS}=VALUE")


def test_a_folder_that_is_not_an_hdcfl_run_is_refused(auto_run: Path, tmp_path: Path) -> None:
    refused(invoke("ablate", tmp_path / "nowhere", "--out", tmp_path / "out"), "no such folder")
    refused(invoke("diagnose", "donor-swap", tmp_path / "nowhere"), "no such folder")
    (tmp_path / "empty").mkdir()
    refused(invoke("ablate", tmp_path / "empty", "--out", tmp_path / "out"), "no scenario.yaml")
    other_method = tmp_path / "ifca"
    shutil.copytree(auto_run, other_method)
    scenario = yaml.safe_load((other_method / "scenario.yaml").read_text())
    scenario["algorithm"]["name"] = "ifca"
    (other_method / "scenario.yaml").write_text(yaml.safe_dump(scenario))
    refused(invoke("ablate", other_method, "--out", tmp_path / "out"), "'ifca'", "only hdcfl runs")
    refused(invoke("ablate", auto_run, "--set", f"{GROUPS}=many", "--out", tmp_path / "out"), GROUPS)
    too_few = invoke("diagnose", "donor-swap", auto_run, "--max-test-samples", 0)
    assert too_few.exit_code == 2 and "--max-test-samples" in too_few.output, too_few.output


def test_a_resume_with_a_safe_override_applies_the_recorded_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    overrides = [f"{key}={json.dumps(value)}" for key, value in {**SHRUNK, "checkpoint.every": 1}.items()]
    run_dir = tmp_path / "stopped"
    with pytest.raises(KeyboardInterrupt):
        run_simulation(prepare_run(load_scenario(QUICKSTART, overrides)), run_dir, StopAfterRound(2))
    recorded = json.loads((run_dir / "manifest.json").read_text())["auto_knobs"]

    import hdcfl_ray.auto_knobs.choose as choose

    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a resume chose its auto knobs again")

    monkeypatch.setattr(choose, "choose_auto_knobs", never)
    # an auto knob is not a key a resume may change; a safe key is
    refused(invoke("simulate", "--resume", run_dir, "--set", f"{GROUPS}=2"), GROUPS)
    result = invoke("simulate", "--resume", run_dir, "--set", "checkpoint.every=2", "--quiet")
    assert result.exit_code == 0, result.output
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "completed" and manifest["auto_knobs"] == recorded
    # every refresh, before the stop and after the resume, with the G the run chose
    assert {row["num_groups"] for row in read_table(run_dir, "refresh").to_pylist()} == {recorded["knobs"][0]["chosen"]}
