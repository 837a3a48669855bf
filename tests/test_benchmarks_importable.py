"""The repository's benchmarks package is the one imported, also with a package of the same
name installed (Opacus's wheel, the `dp` extra, installs one called `benchmarks`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_benchmarks_imports_from_the_repository() -> None:
    import benchmarks
    from benchmarks import gpu_check

    assert Path(benchmarks.__file__).resolve().is_relative_to(ROOT / "benchmarks")
    assert Path(gpu_check.__file__).resolve() == ROOT / "benchmarks" / "gpu_check.py"


def test_a_process_started_in_the_repository_finds_its_benchmarks() -> None:
    """What `python -m benchmarks.NAME` from the repository root resolves."""
    found = subprocess.run(
        [sys.executable, "-c", "import benchmarks.round_layout as m; print(m.__file__)"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )
    assert Path(found.stdout.strip()).resolve() == ROOT / "benchmarks" / "round_layout.py"
