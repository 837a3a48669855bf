"""Run a scenario in both modes on a two-node `ray.cluster_utils.Cluster` whose nodes
were started in an environment that imitates other machines (instruction-set caps,
tests/portable_runs.py), from a driver started with the portable environment. A
host actor's worker inherits its node's environment, so only the runtime_env a
portable run gives its actors can pin it.

    env $(python -m hdcfl_ray.portable) python -m tests.portable_cluster_run SCENARIO.yaml MACHINE OUT_DIR

writes OUT_DIR/{portable,default}/ (run folders) and OUT_DIR/result.json."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(scenario_path: str, machine: str, out: str) -> None:
    import ray
    import torch
    from ray.cluster_utils import Cluster

    from hdcfl_ray.config.loading import load_scenario
    from hdcfl_ray.runtime.driver import prepare_run, run_simulation
    from tests.portable_runs import MACHINES, clients_rows, imitating

    torch.backends.cpu.get_cpu_capability()  # this driver's libraries settle on the pins it started with
    pinned = dict(os.environ)
    os.environ.clear()
    os.environ.update(imitating(machine))  # what the nodes' processes (raylets, workers) inherit
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    os.environ.clear()
    os.environ.update(pinned)
    result: dict[str, object] = {"machine": MACHINES[machine]}
    try:
        ray.init(address=cluster.address, logging_level="ERROR", configure_logging=True)
        cluster.wait_for_nodes()
        for mode in ("portable", "default"):
            overrides = ["runtime.backend=ray", "runtime.num_cpus_per_actor=0.5", f"runtime.portable={str(mode == 'portable').lower()}"]
            run_dir = Path(out) / mode
            run_simulation(prepare_run(load_scenario(Path(scenario_path), overrides)), run_dir)
            manifest = json.loads((run_dir / "manifest.json").read_text())
            result[mode] = {
                "rows": clients_rows(run_dir),
                "nodes": sorted(set(manifest["client_host_nodes"])),
                "hosts_started_with": [host["arithmetic"]["started_with"] for host in manifest["client_host_hardware"]],
            }
        result["cluster_nodes"] = sorted(node["NodeID"] for node in ray.nodes() if node.get("Alive"))
        (Path(out) / "result.json").write_text(json.dumps(result))
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:4])
