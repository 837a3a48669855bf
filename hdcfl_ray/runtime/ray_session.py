"""Starting or joining Ray for one run, and checking the cluster can host the actors."""

from __future__ import annotations

import os
from typing import Any

import ray

from hdcfl_ray.config.schema import RuntimeConfig
from hdcfl_ray.errors import ScenarioError


class RaySession:
    """Context manager: joins an existing Ray (a test fixture, `--address auto`) or
    starts a local one, and shuts down only what it started."""

    def __init__(self, runtime: RuntimeConfig) -> None:
        self.runtime = runtime
        self.started_here = False

    def __enter__(self) -> "RaySession":
        if not ray.is_initialized():
            # Ray warns loudly about things a simulator user cannot act on.
            os.environ.setdefault("RAY_DEDUP_LOGS", "1")
            os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
            kwargs: dict[str, Any] = {
                "include_dashboard": self.runtime.include_dashboard,
                # Ray's own start-up notices are noise to a simulator user; failures still raise.
                "logging_level": "ERROR",
                "configure_logging": True,
            }
            if self.runtime.include_dashboard:
                kwargs["dashboard_host"] = self.runtime.dashboard_host
            if self.runtime.address is None:
                # "local" starts a fresh instance even when a `ray start` cluster runs on this
                # machine (ray.init() alone would join it): address null means a private Ray.
                kwargs["address"] = "local"
                kwargs["num_cpus"] = self.runtime.num_cpus
            else:
                kwargs["address"] = self.runtime.address
            ray.init(**kwargs)
            self.started_here = True
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.started_here:
            ray.shutdown()

    @property
    def cpus(self) -> float:
        return float(ray.cluster_resources().get("CPU", 0.0))

    @property
    def gpus(self) -> float:
        return float(ray.cluster_resources().get("GPU", 0.0))

    def describe(self) -> dict[str, Any]:
        resources = ray.cluster_resources()
        return {
            "address": self.runtime.address or "local",
            "nodes": len([node for node in ray.nodes() if node.get("Alive")]),
            "cpus": resources.get("CPU", 0.0),
            "gpus": resources.get("GPU", 0.0),
            "ray_version": ray.__version__,
        }

    def check_capacity(self, num_hosts: int) -> None:
        """Actors that cannot all be placed would wait forever: refuse up front."""
        runtime = self.runtime
        needed_cpus = num_hosts * runtime.num_cpus_per_actor
        if needed_cpus > self.cpus + 1e-9:
            raise ScenarioError(
                f"runtime: {num_hosts} client host actors x runtime.num_cpus_per_actor = {runtime.num_cpus_per_actor} "
                f"need {needed_cpus:g} CPUs but the Ray cluster has {self.cpus:g}; set runtime.clients_per_actor: auto, "
                f"raise it, or lower runtime.num_cpus_per_actor"
            )
        needed_gpus = num_hosts * runtime.num_gpus_per_actor
        if needed_gpus > self.gpus + 1e-9:
            raise ScenarioError(
                f"runtime.num_gpus_per_actor: {runtime.num_gpus_per_actor} x {num_hosts} actors needs {needed_gpus:g} GPUs "
                f"but the Ray cluster has {self.gpus:g}; set runtime.num_gpus_per_actor: 0 to train on CPU"
            )
