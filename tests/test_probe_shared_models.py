"""The paper-size probe pairs a clustered method's clients with Local's same clients,
split by whether a client ended alone in its group or sharing it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.script_modules import REPOSITORY, load_script

SCRIPT = REPOSITORY / "scenarios" / "cpu" / "paper-size" / "probe_shared_models.py"


def load_probe():
    return load_script(SCRIPT, "probe_shared_models")


def write_run(root: Path, method: str, seed: int, groups: list[int | None], accuracy: list[float]) -> None:
    run_dir = root / "setting" / method / f"seed{seed}"
    run_dir.mkdir(parents=True)
    final = len(groups)
    table = pa.table(
        {
            "round": [1] * final + [5] * final,  # only the last round counts
            "client_id": list(range(final)) * 2,
            "group": [0] * final + groups,
            "accuracy": [0.0] * final + accuracy,
            "accuracy_own_classes": [0.0] * final + [min(1.0, a + 0.1) for a in accuracy],
        }
    )
    pq.write_table(table, run_dir / "clients.parquet")


def test_rows_pair_lone_and_sharing_clients_with_local(tmp_path: Path):
    write_run(tmp_path, "pacfl", 42, [0, 1, 1, 2], [0.8, 0.4, 0.6, 0.9])
    write_run(tmp_path, "local", 42, [None] * 4, [0.8, 0.7, 0.7, 0.9])
    rows = load_probe().paired_rows(tmp_path, ["pacfl"])
    alone, sharing = rows
    assert (alone["clients"], alone["n"]) == ("alone in its group", 2)
    assert alone["method_acc"] == pytest.approx(85.0) and alone["local_acc"] == pytest.approx(85.0)
    assert (sharing["clients"], sharing["n"]) == ("sharing its group", 2)
    assert sharing["method_acc"] == pytest.approx(50.0) and sharing["local_acc"] == pytest.approx(70.0)
    assert sharing["own_classes"] == pytest.approx(60.0)


def test_a_run_without_local_beside_it_is_named_and_the_script_fails(tmp_path: Path):
    write_run(tmp_path, "ifca", 7, [0, 0], [0.5, 0.5])
    result = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "ifca"], capture_output=True, text=True)
    assert result.returncode == 1
    assert "no Local run for setting/seed7" in result.stderr and "no runs of ifca" in result.stderr


def test_the_page_gives_the_difference_and_names_what_made_the_runs(tmp_path: Path):
    import json

    write_run(tmp_path, "pacfl", 42, [0, 1, 1, 2], [0.8, 0.4, 0.6, 0.9])
    write_run(tmp_path, "local", 42, [None] * 4, [0.8, 0.7, 0.7, 0.9])
    manifest = {"git_revision": "abcdef0123456789", "hardware": {"cpu_model": "AMD EPYC"}, "packages": {"torch": "2.14.1", "ray": "2.60.0"}}
    for method in ("pacfl", "local"):
        (tmp_path / "setting" / method / "seed42" / "manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "probe.md"
    result = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "pacfl", "--out", str(out)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    assert "| setting | pacfl | 42 | sharing its group | 2 | 50.00 | 70.00 | -20.00 | 60.00 |" in text
    assert "Made from 2 runs: commit abcdef0123; on AMD EPYC; torch 2.14.1; Ray 2.60.0." in text
    assert text.startswith("<!-- generated: python scenarios/cpu/paper-size/probe_shared_models.py ")
