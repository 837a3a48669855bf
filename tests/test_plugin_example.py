"""examples/plugin/ is a package of its own: installed with `pip install -e` into a
fresh virtual environment (which sees this one's packages but not its files, so the
shared environment is left as it was), `hdcfl-ray plugins` lists its method,
partition and data source, and its scenario runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "plugin"


@pytest.fixture(scope="module")
def plugin_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("plugin-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    # this environment's packages (pip, setuptools, hdcfl-ray, torch) without copying them
    shared = sysconfig.get_paths()["purelib"]
    (Path(purelib) / "shared_environment.pth").write_text(f"import site; site.addsitedir({shared!r})\n")
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-e", str(EXAMPLE)],
        capture_output=True, text=True, cwd=venv,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    return python


def hdcfl_ray(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("HDCFL_RAY_PLUGINS", None)
    return subprocess.run([str(python), "-m", "cli", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


def test_the_example_is_its_own_package() -> None:
    assert (EXAMPLE / "pyproject.toml").is_file()
    text = (EXAMPLE / "pyproject.toml").read_text()
    for group in ("hdcfl_ray.methods", "hdcfl_ray.partitions", "hdcfl_ray.sources"):
        assert f'"{group}"' in text


def test_the_installed_example_is_listed_with_its_keys(plugin_venv: Path, tmp_path: Path) -> None:
    listed = hdcfl_ray(plugin_venv, "plugins", cwd=ROOT)
    assert listed.returncode == 0, listed.stderr
    for name in ("fedavgm", "quantity_skew", "stripes"):
        assert f"{name}  [plugin hdcfl-plugin-example 0.1.0" in listed.stdout
    for key in ("algorithm.fedavgm.momentum", "partition.quantity_skew.beta", "dataset.stripes.num_classes"):
        assert key in listed.stdout


def test_the_example_scenario_runs_two_rounds_and_records_the_plugin(plugin_venv: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    ran = hdcfl_ray(
        plugin_venv, "simulate", str(EXAMPLE / "scenario.yaml"), "--set", "protocol.rounds=2", "--out", str(run_dir), "-q",
        cwd=ROOT,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "completed"
    assert {(row["kind"], row["name"], row["package"], row["version"]) for row in manifest["plugins"]} == {
        ("method", "fedavgm", "hdcfl-plugin-example", "0.1.0"),
        ("partition", "quantity_skew", "hdcfl-plugin-example", "0.1.0"),
        ("source", "stripes", "hdcfl-plugin-example", "0.1.0"),
    }


def test_this_environment_does_not_see_the_example() -> None:
    from hdcfl_ray.plugins import plugin_specs

    assert "fedavgm" not in plugin_specs("methods")
