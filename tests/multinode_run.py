"""Run one scenario on a two-node `ray.cluster_utils.Cluster` (separate process:
the test session already holds a single-node Ray). Each node declares one CPU;
with `num_cpus_per_actor: 0.5` two host actors fit per node, so four hosts must
use both nodes. (No virtual GPUs: a host granted a GPU trains on it, and these
nodes have none.)

    python -m tests.multinode_run SCENARIO.yaml RUN_DIR RESULT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

from hdcfl_ray.config.loading import load_scenario
from hdcfl_ray.runtime.driver import prepare_run, run_simulation


def main(scenario_path: str, run_dir: str, result_path: str) -> None:
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False},
    )
    cluster.add_node(num_cpus=1)
    try:
        ray.init(address=cluster.address, logging_level="ERROR", configure_logging=True)
        cluster.wait_for_nodes()
        scenario = load_scenario(Path(scenario_path))
        run_simulation(prepare_run(scenario), Path(run_dir))
        nodes = sorted(node["NodeID"] for node in ray.nodes() if node.get("Alive"))
        manifest = json.loads((Path(run_dir) / "manifest.json").read_text())
        Path(result_path).write_text(json.dumps({"cluster_nodes": nodes, "manifest": manifest}))
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:4])
