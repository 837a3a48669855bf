"""A run records whether its code differed from the commit it names; documentation
changed beside it (a long script writing its reports into docs/) and kept runs replaced
in results/ do not count."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hdcfl_ray.logs.manifest import git_dirty


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True, capture_output=True)


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "pkg" / "code.py").write_text("x = 1\n")
    (tmp_path / "docs" / "page.md").write_text("old\n")
    (tmp_path / "README.md").write_text("old\n")
    (tmp_path / "results" / "kept" / "seed42").mkdir(parents=True)
    (tmp_path / "results" / "kept" / "seed42" / "rounds.parquet").write_bytes(b"a kept run")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "start")
    return tmp_path


def test_clean_checkout_is_not_dirty(repo: Path):
    assert git_dirty(repo / "pkg") is False


def test_changed_documentation_is_not_dirty(repo: Path):
    (repo / "docs" / "page.md").write_text("a report written between runs\n")
    (repo / "README.md").write_text("new\n")
    (repo / "docs" / "figure.png").write_bytes(b"untracked")
    assert git_dirty(repo / "pkg") is False


def test_kept_runs_replaced_in_results_are_not_dirty(repo: Path):
    # a comparison removes a method's kept runs before rerunning them at a recalibrated knob
    (repo / "results" / "kept" / "seed42" / "rounds.parquet").unlink()
    assert git_dirty(repo / "pkg") is False


def test_changed_code_is_dirty(repo: Path):
    (repo / "pkg" / "code.py").write_text("x = 2\n")
    assert git_dirty(repo / "pkg") is True


def test_outside_a_checkout_is_unknown(tmp_path: Path):
    assert git_dirty(tmp_path) is None
