"""The Python API (hdcfl_ray.simulate, load_run, sweep, report): the same runs as the
CLI, bad input as ScenarioError with the CLI's message, nothing printed on request."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import hdcfl_ray
from cli import app
from tests.conftest import tiny_scenario

ROOT = Path(__file__).resolve().parent.parent


def small(**changes):
    """A two-round digits run in this process (no Ray): a few seconds."""
    base = {"runtime": {"backend": "local", "num_cpus": 1}, "protocol": {"rounds": 2}}
    for key, value in changes.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return tiny_scenario(**base)


def client_columns(run_dir: Path) -> dict[str, list]:
    import pyarrow.parquet as pq

    table = pq.read_table(run_dir / "clients.parquet").sort_by([("round", "ascending"), ("client_id", "ascending")])
    return {column: table.column(column).to_pylist() for column in ("accuracy", "accuracy_global", "accuracy_local", "loss")}


def test_api_and_cli_give_bit_identical_client_accuracies(tmp_path, write_scenario, capsys):
    path = write_scenario(small())
    result = CliRunner().invoke(app, ["simulate", str(path), "--set", "seed=11", "--out", str(tmp_path / "cli"), "--quiet"])
    assert result.exit_code == 0, result.output

    # the same file and override through the API, printing nothing
    capsys.readouterr()
    run = hdcfl_ray.simulate(path, overrides={"seed": 11}, out=tmp_path / "api", progress=False)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""

    assert client_columns(run.dir) == client_columns(tmp_path / "cli")
    assert run.status == "completed" and run.scenario["seed"] == 11
    assert run.rounds.num_rows == 2 and run.clients.num_rows == 2 * 8
    final = run.final
    assert final["round"] == 2
    assert final["mean_accuracy"] == run.rounds.column("mean_accuracy").to_pylist()[-1]
    assert 0.0 <= final["worst_accuracy"] <= final["bottom20_accuracy"] <= final["mean_accuracy"] <= 1.0

    # a mapping with the file's content is the same run; load_run reads it back
    mapping_run = hdcfl_ray.simulate({**small(), "seed": 11}, out=tmp_path / "mapping", progress=False)
    assert client_columns(mapping_run.dir) == client_columns(run.dir)
    loaded = hdcfl_ray.load_run(run.dir)
    assert loaded.final == final and loaded.clients.equals(run.clients)

    with pytest.raises(hdcfl_ray.ScenarioError, match="seed 11"):  # two runs of one seed count once: which one?
        hdcfl_ray.report([run, tmp_path / "cli"], format="md")
    with pytest.warns(UserWarning, match="Left out as repeats"):
        markdown = hdcfl_ray.report([run, tmp_path / "cli"], format="md", keep_duplicate="newest")
    assert "| hdcfl |" in markdown and "tiny" in markdown
    assert "hdcfl" in hdcfl_ray.report(run.dir, format="csv")


def test_progress_shows_the_live_view_and_the_summary(tmp_path, capsys):
    run = hdcfl_ray.simulate(small(), out=tmp_path / "run", progress=True)
    printed = capsys.readouterr().out
    # the console folds long lines at its width, so compare with the folds removed
    assert "run directory:" in printed and str(run.dir) in "".join(printed.split())
    assert "client test accuracy (%)" in printed  # the summary table


def test_bad_input_raises_scenario_error_with_the_cli_message(tmp_path, write_scenario, capsys):
    path = write_scenario(small())
    cli = CliRunner().invoke(app, ["validate", str(path), "--set", "protocol.batch_sise=16"])
    assert cli.exit_code == 2
    with pytest.raises(hdcfl_ray.ScenarioError) as raised:
        hdcfl_ray.simulate(path, overrides={"protocol.batch_sise": 16}, out=tmp_path / "never", progress=False)
    assert str(raised.value) in cli.output
    assert "did you mean 'batch_size'?" in str(raised.value)
    assert not (tmp_path / "never").exists()

    with pytest.raises(hdcfl_ray.ScenarioError, match="partition.kk"):
        hdcfl_ray.simulate(small(partition={"kk": 3}), progress=False)
    with pytest.raises(hdcfl_ray.ScenarioError, match="no such scenario file"):
        hdcfl_ray.simulate(tmp_path / "missing.yaml", progress=False)
    with pytest.raises(hdcfl_ray.ScenarioError, match="overrides"):
        hdcfl_ray.simulate(path, overrides=["protocol.rounds=1"], progress=False)  # type: ignore[arg-type]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(hdcfl_ray.ScenarioError, match="not a run directory"):
        hdcfl_ray.load_run(empty)
    with pytest.raises(hdcfl_ray.ScenarioError, match="choose table, md, csv or latex"):
        hdcfl_ray.report(tmp_path, format="html")
    with pytest.raises(hdcfl_ray.ScenarioError, match="no completed runs"):
        hdcfl_ray.report(empty)
    assert capsys.readouterr().out == ""


def test_override_values_keep_their_python_types():
    from hdcfl_ray.api import resolve_scenario

    scenario = resolve_scenario(
        small(),
        {"partition.angles": (0, 90), "protocol.optimizer.lr": 1e-3, "name": "123", "output.dir": Path("elsewhere")},
    )
    assert list(scenario.partition.angles) == [0.0, 90.0]
    assert scenario.protocol.optimizer.lr == 1e-3
    assert scenario.name == "123" and scenario.output.dir == "elsewhere"


def test_import_is_light():
    code = "import sys, hdcfl_ray; print(sorted(m for m in ('torch', 'ray', 'pyarrow', 'pydantic') if m in sys.modules))"
    printed = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert printed.strip() == "[]"
    assert callable(hdcfl_ray.sweep)
    importlib.import_module("hdcfl_ray.sweeps.grid")  # the machinery's package has its own name: nothing to patch
    assert callable(hdcfl_ray.sweep) and hdcfl_ray.sweep.__module__ == "hdcfl_ray.api"


@pytest.mark.slow  # a long end-to-end run: the slow tier (.ci/run runs it after the README's command)
@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_sweep_runs_the_grid_and_reports_it(tmp_path, write_scenario):
    hdcfl = {"name": "hdcfl", "hdcfl": {"groups": 2, "activation_round": 1, "refresh_every": 1}}
    path = write_scenario(tiny_scenario(protocol={"rounds": 1}, partition={"num_clients": 4}, algorithm=hdcfl))
    result = hdcfl_ray.sweep([path], out=tmp_path / "grid", algorithms=["fedavg_se", "hdcfl"], progress=False)
    assert sorted(result.completed) == ["tiny/fedavg_se/seed7", "tiny/hdcfl/seed7"] and not result.failed
    assert {run.scenario["algorithm"]["name"] for run in result.runs} == {"fedavg_se", "hdcfl"}
    assert all(run.final["mean_accuracy"] is not None for run in result.runs)
    assert "fedavg_se" in result.report("md")
    again = hdcfl_ray.sweep([path], out=tmp_path / "grid", algorithms=["fedavg_se", "hdcfl"], progress=False)
    assert len(again.skipped) == 2 and not again.completed


def test_the_command_and_the_api_write_the_same_report_bytes(tmp_path):
    """One implementation of a report: `hdcfl-ray report` and `hdcfl_ray.report` give the
    same bytes for the same runs, in every format."""
    from typer.testing import CliRunner

    from cli import app

    runs = [
        hdcfl_ray.simulate(tiny_scenario(algorithm={"name": name}, protocol={"rounds": 2}, runtime={"backend": "local"}, seed=seed),
                           out=tmp_path / f"{name}-{seed}", progress=False)
        for name in ("fedavg_se", "hdcfl") for seed in (1, 2)
    ]  # fmt: skip
    for fmt in ("md", "csv", "latex"):
        out = tmp_path / f"report.{fmt}"
        result = CliRunner().invoke(app, ["report", *(str(run.dir) for run in runs), "--format", fmt, "--out", str(out)])
        assert result.exit_code == 0, result.output
        assert out.read_bytes() == hdcfl_ray.report(runs, format=fmt).encode()
