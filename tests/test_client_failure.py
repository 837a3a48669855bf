"""A client whose update raises stops the run with an error that names the client and
the round: alone, in a batched group, and on a Ray host; the manifest keeps that text
plain (no terminal colour codes from Ray's remote tracebacks), and the command's first
line names the client and the round on either backend, its traceback after it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import hdcfl_ray
from cli import app
from hdcfl_ray.errors import ClientUpdateFailed, failure_text
from tests.conftest import tiny_scenario
from tests.test_plain_text import CONTROLS
from tests.test_plugins import loaded_plugin

# a plugin inside this repository's tests package: importable by name on the workers of
# the test session's Ray, which start in this checkout (a plugin from elsewhere is shipped
# by runtime_env, tested in test_plugins_on_ray.py)
MODULE = "tests.failing_client_plugin"


@pytest.fixture
def failing_method(monkeypatch: pytest.MonkeyPatch):
    yield from loaded_plugin(MODULE, monkeypatch)


def _scenario(**runtime: object) -> dict:
    return tiny_scenario(algorithm={"name": "failing_avg"}, protocol={"rounds": 3}, runtime=runtime)


def _failed_run(tmp_path: Path, runtime: dict) -> tuple[BaseException, dict]:
    run_dir = tmp_path / "run"
    with pytest.raises(Exception) as raised:
        hdcfl_ray.simulate(_scenario(**runtime), out=run_dir, progress=False, plugins=[MODULE])
    manifest = json.loads((run_dir / "manifest.json").read_text())
    return raised.value, manifest


@pytest.mark.parametrize(
    "runtime",
    [
        {"backend": "local", "num_cpus": 1, "batched_training": True},  # one host: the round's clients train as one group
        {"backend": "local", "num_cpus": 1, "batched_training": False},
    ],
    ids=["batched", "alone"],
)
def test_a_failing_client_is_named_with_its_round_on_the_local_backend(failing_method: str, tmp_path: Path, runtime: dict) -> None:
    error, manifest = _failed_run(tmp_path, runtime)
    assert isinstance(error, ClientUpdateFailed)
    assert (error.client_ids, error.round_index) == ((3,), 2)
    assert "client 3 failed in round 2: ValueError: the client's data loader broke" in str(error)
    assert manifest["status"] == "failed"
    assert "client 3 failed in round 2" in manifest["error"]
    assert "raise ValueError" in manifest["error_traceback"]


@pytest.mark.ray
def test_a_failing_client_on_a_ray_host_is_named_and_the_manifest_has_no_terminal_codes(
    ray_session: None, failing_method: str, tmp_path: Path
) -> None:
    runtime = {"backend": "ray", "clients_per_actor": 8, "num_cpus_per_actor": 1, "batched_training": True}
    error, manifest = _failed_run(tmp_path, runtime)
    assert "client 3 failed in round 2" in str(error)
    # the same text as the local backend stores: the error as the client raised it, not Ray's traceback around it
    assert manifest["error"] == "ClientUpdateFailed: client 3 failed in round 2: ValueError: the client's data loader broke"
    # where it happened is kept beside it, as plain text
    assert "raise ValueError" in manifest["error_traceback"] and not set(manifest["error_traceback"]) & set(CONTROLS)


FIRST_LINE = "run failed: ClientUpdateFailed: client 3 failed in round 2: ValueError: the client's data loader broke"


def _command_failure(tmp_path: Path, runtime: dict) -> list[str]:
    """The lines `hdcfl-ray simulate` writes to stderr for the failing client."""
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(_scenario(**runtime), sort_keys=False))
    result = CliRunner().invoke(app, ["simulate", str(scenario), "--out", str(tmp_path / "run"), "--quiet"])
    assert result.exit_code == 1, result.output
    assert not set(result.stderr) & set(CONTROLS)  # no terminal codes, no carriage returns, no bells
    return result.stderr.splitlines()


def test_the_commands_first_line_names_the_failing_client_and_its_traceback_follows(failing_method: str, tmp_path: Path) -> None:
    lines = _command_failure(tmp_path, {"backend": "local", "num_cpus": 1, "batched_training": False})
    assert lines[0] == FIRST_LINE
    assert lines[1] == "Traceback (most recent call last):" and "tests/failing_client_plugin.py" in "\n".join(lines)
    assert lines[-1].startswith("finished rounds are in ")


@pytest.mark.ray
def test_a_ray_failures_terminal_text_names_the_client_first_and_is_plain(ray_session: None, failing_method: str, tmp_path: Path) -> None:
    runtime = {"backend": "ray", "clients_per_actor": 8, "num_cpus_per_actor": 1, "batched_training": True}
    lines = _command_failure(tmp_path, runtime)
    assert lines[0] == FIRST_LINE  # as on the local backend, not at the end of Ray's traceback
    traceback_text = "\n".join(lines[1:])
    assert "ray::ClientHost.train_many()" in lines[1]  # the worker's traceback, after the first line
    assert 'tests/failing_client_plugin.py", line' in traceback_text and "ValueError: the client's data loader broke" in traceback_text
    assert lines[-1].startswith("finished rounds are in ")


def test_stored_failure_text_drops_terminal_escape_sequences() -> None:
    coloured = RuntimeError("\x1b[36mray::ClientHost.train_many()\x1b[39m (pid=1)\x1b]8;;http://x\x07link\x1b]8;;\x07 \x1b[1mboom\x1b[0m")
    assert failure_text(coloured) == "RuntimeError: ray::ClientHost.train_many() (pid=1)link boom"


def test_the_error_naming_clients_survives_pickling() -> None:
    import pickle

    error = ClientUpdateFailed((3, 5), 2, "ValueError: x")
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error) == "clients 3, 5 (training together) failed in round 2: ValueError: x"
    assert copy.client_ids == (3, 5)
