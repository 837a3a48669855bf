"""The project's code and pages cite only what a clone holds: no file under the checked paths names a
`spec/` folder (the method descriptions are docs/hdcfl.md and docs/baselines.md)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("hdcfl_ray", "analysis", "docs", "scenarios", "README.md", "cli.py")
# `spec/` as a path of its own (not the tail of another word or path), or a `shared/spec/` outside the clone.
SPEC_PATH = re.compile(r"(?<![\w/.-])spec/|shared/spec/")
BINARY_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".pdf", ".parquet", ".pt", ".npz", ".npy", ".gz", ".zip"})


def checked_files() -> list[str]:
    """The tracked files under CHECKED (every file there when git is not available)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--", *CHECKED], cwd=ROOT, capture_output=True, check=True
        ).stdout.decode("utf-8")
        names = [name for name in listed.split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        names = []
        for entry in CHECKED:
            path = ROOT / entry
            found = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
            names += [p.relative_to(ROOT).as_posix() for p in found if "__pycache__" not in p.parts]
    return sorted(names)


def test_no_checked_file_cites_a_spec_folder() -> None:
    names = checked_files()
    assert "README.md" in names and any(name.startswith("docs/") for name in names)
    citing: list[str] = []
    for name in names:
        path = ROOT / name
        if path.suffix.lower() in BINARY_SUFFIXES or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), start=1):
            if SPEC_PATH.search(line):
                citing.append(f"{name}:{number}: {line.strip()}")
    assert citing == [], "cite docs/hdcfl.md or docs/baselines.md instead of spec/:\n" + "\n".join(citing)


def test_the_pattern_finds_a_spec_path_and_nothing_else() -> None:
    assert SPEC_PATH.search("see spec/hdcfl.md, section 2")
    assert SPEC_PATH.search("(`spec/baselines.md`)")
    assert SPEC_PATH.search("../shared/spec/hdcfl.md")
    assert not SPEC_PATH.search("docs/hdcfl.md") and not SPEC_PATH.search("the spec's rule")
    assert not SPEC_PATH.search("tests/my-spec/file") and not SPEC_PATH.search("respec/x")
