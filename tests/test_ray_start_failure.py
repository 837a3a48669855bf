"""A Ray that cannot start (its node timed out, say, on a machine short of CPU time) ends
the command with one line saying what usually causes it, exit code 1, not Ray's traceback."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hdcfl_ray.errors import RayStartFailed


def test_a_failed_ray_start_is_named_and_stops_what_it_started(monkeypatch: pytest.MonkeyPatch) -> None:
    from hdcfl_ray.runtime.backends import ray_session

    stopped: list[str] = []

    def timed_out(*args: object, **kwargs: object) -> None:
        raise Exception("The current node timed out during startup.")

    monkeypatch.setattr(ray_session.ray, "init", timed_out)
    monkeypatch.setattr(ray_session, "stop_private_ray", lambda marker, grace_s=5.0: stopped.append(marker) or [])
    with pytest.raises(RayStartFailed) as refused:
        ray_session.start_private_ray(2)
    message = str(refused.value)
    assert "Ray could not start on this machine" in message and "timed out during startup" in message
    assert "ray stop" in message and "runtime.backend=local" in message and len(stopped) == 1


def test_the_command_prints_one_line_and_exits_1(tmp_path) -> None:
    script = textwrap.dedent(
        """
        import sys
        from hdcfl_ray.runtime.backends import ray_session
        def timed_out(*args, **kwargs):
            raise Exception("The current node timed out during startup.")
        ray_session.ray.init = timed_out
        ray_session.stop_private_ray = lambda marker, grace_s=5.0: []
        import cli
        sys.argv = ["hdcfl-ray", "sweep", "scenarios/quickstart.yaml", "--algorithms", "fedavg", "--seeds", "1",
                    "--set", "protocol.rounds=1", "--out", sys.argv[1]]
        cli.app()
        """
    )
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "sweep")], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 1, done.stderr
    assert "error: Ray could not start on this machine" in done.stderr and "Traceback" not in done.stderr
