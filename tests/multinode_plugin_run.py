"""Run a plugin's scenario on a two-node `ray.cluster_utils.Cluster`, joined as a
user joins a cluster (`runtime.address`), in a process of its own (the test session
already holds a single-node Ray). Each node declares one CPU, so four half-CPU hosts
use both nodes.

With PLUGIN_DIR and MODULE, the module is loaded as `--plugin MODULE` loads it, from
a folder only this process has on its path, and only after the cluster has started:
the nodes' workers neither see the folder nor inherit HDCFL_RAY_PLUGINS, so the run
works only if hdcfl-ray ships both. Without them the plugins are the installed entry
points this interpreter sees.

    python -m tests.multinode_plugin_run SCENARIO.yaml RUN_DIR RESULT.json [PLUGIN_DIR MODULE]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ray.cluster_utils import Cluster


def main(scenario_path: str, run_dir: str, result_path: str, plugin_dir: str | None = None, module: str | None = None) -> None:
    from hdcfl_ray.plugins import ENV_VAR

    os.environ.pop(ENV_VAR, None)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    try:
        cluster.wait_for_nodes()
        from hdcfl_ray.config.loading import load_scenario
        from hdcfl_ray.plugins import load_plugins
        from hdcfl_ray.runtime.driver import prepare_run, run_simulation

        if plugin_dir is not None and module is not None:
            sys.path.insert(0, plugin_dir)
            load_plugins([module])
        scenario = load_scenario(Path(scenario_path), [f"runtime.address={cluster.address}"])
        run_simulation(prepare_run(scenario), Path(run_dir))
        manifest = json.loads((Path(run_dir) / "manifest.json").read_text())
        Path(result_path).write_text(json.dumps({"manifest": manifest}))
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:6])
