"""A scenario a command must refuse: `validate` or `simulate` exits 2, its message holds
every expected fragment (the key and the fix), and `simulate` makes no run folder."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from cli import app


def assert_refused(command: str, scenario: Path, tmp_path: Path, expected: list[str]) -> None:
    out = tmp_path / "run"
    args = [command, str(scenario)] + (["--out", str(out), "--quiet"] if command == "simulate" else [])
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    for fragment in expected:
        assert fragment in result.output, f"{fragment!r} not in:\n{result.output}"
    assert not out.exists()
