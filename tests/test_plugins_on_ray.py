"""Plugins on the Ray backend across two nodes. A module named with --plugin, from a
folder only the driver has on its path and loaded after the cluster started, reaches
every worker (its code and its name, through Ray's runtime_env): its method, partition,
data source, transform and encoder run on hosts spread over both nodes. An installed
entry-point plugin runs there too. Without plugins, no runtime_env is asked for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hdcfl_ray import plugin_shipping, plugins
from tests.test_plugin_example import EXAMPLE, plugin_venv  # noqa: F401  (a fixture: the example installed in a venv)
from tests.test_plugins import MODULE, SOURCE, plugin_scenario

REPO = Path(__file__).resolve().parents[1]
# four half-CPU hosts, one client each: two one-CPU nodes must both hold hosts
SPREAD = {"backend": "ray", "num_cpus": None, "clients_per_actor": 1, "num_cpus_per_actor": 0.5}


def run_on_two_nodes(python: str, scenario: dict, tmp_path: Path, *plugin: str) -> dict:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario, sort_keys=False))
    result_path = tmp_path / "result.json"
    environment = {key: value for key, value in os.environ.items() if key not in ("RAY_ADDRESS", plugins.ENV_VAR)}
    environment["PYTHONPATH"] = str(REPO)  # hdcfl-ray's own checkout; never the plugin's folder
    completed = subprocess.run(
        [python, "-m", "tests.multinode_plugin_run", str(path), str(tmp_path / "run"), str(result_path), *plugin],
        cwd=REPO, env=environment, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-4000:]
    return json.loads(result_path.read_text())["manifest"]


@pytest.mark.slow  # a long end-to-end run: the slow tier (.ci/run runs it after the README's command)
def test_a_plugin_module_runs_on_hosts_spread_over_two_nodes(tmp_path: Path) -> None:
    plugin_dir = tmp_path / "plugin-folder"
    plugin_dir.mkdir()
    (plugin_dir / f"{MODULE}.py").write_text(SOURCE)
    scenario = plugin_scenario(runtime=SPREAD)
    manifest = run_on_two_nodes(sys.executable, scenario, tmp_path, str(plugin_dir), MODULE)
    assert manifest["status"] == "completed"
    assert manifest["runtime"]["backend"] == "ray" and manifest["runtime"]["nodes"] == 2
    assert manifest["num_client_hosts"] == 4 and len(set(manifest["client_host_nodes"])) == 2
    recorded = {(row["kind"], row["name"]) for row in manifest["plugins"]}
    assert {("method", "plugin_avg"), ("encoder", "pooled_conv"), ("partition", "halves")} <= recorded


@pytest.mark.slow  # a virtual environment with the example installed, and a cluster: about a minute
def test_an_installed_entry_point_plugin_runs_on_hosts_spread_over_two_nodes(plugin_venv: Path, tmp_path: Path) -> None:  # noqa: F811
    scenario = yaml.safe_load((EXAMPLE / "scenario.yaml").read_text())
    scenario["partition"]["num_clients"] = 4
    scenario["protocol"]["rounds"] = 2
    scenario["runtime"] = SPREAD
    manifest = run_on_two_nodes(str(plugin_venv), scenario, tmp_path)
    assert manifest["status"] == "completed" and manifest["runtime"]["nodes"] == 2
    assert len(set(manifest["client_host_nodes"])) == 2
    assert ("method", "fedavgm", "hdcfl-plugin-example") in {(row["kind"], row["name"], row["package"]) for row in manifest["plugins"]}


def test_only_plugins_that_are_not_installed_are_shipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(plugins.ENV_VAR, raising=False)
    plugins.clear_caches()
    assert plugin_shipping.ray_runtime_env() == {} and plugin_shipping.actor_options() == {}

    (tmp_path / f"{MODULE}.py").write_text(SOURCE)
    package = tmp_path / "hdcfl_test_plugin_package"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "methods.py").write_text(SOURCE.replace("plugin_avg", "package_avg").replace('"halves"', '"halves2"')
                                        .replace('"blocks"', '"blocks2"').replace('"invert"', '"invert2"')
                                        .replace('"pooled_conv"', '"pooled_conv2"'))  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        plugins.load_plugins([MODULE, "hdcfl_test_plugin_package.methods", "json"])  # json: installed, never shipped
        environment = plugin_shipping.ray_runtime_env()
        assert environment["env_vars"] == {plugins.ENV_VAR: f"{MODULE},hdcfl_test_plugin_package.methods,json"}
        # a single file as itself, a package as its top-level folder
        assert environment["py_modules"] == [str(tmp_path / f"{MODULE}.py"), str(package)]
        assert plugin_shipping.actor_options() == {"runtime_env": {"env_vars": environment["env_vars"]}}
    finally:
        os.environ.pop(plugins.ENV_VAR, None)
        plugins.clear_caches()
        for name in (MODULE, "hdcfl_test_plugin_package", "hdcfl_test_plugin_package.methods"):
            sys.modules.pop(name, None)
