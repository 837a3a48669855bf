"""Short real runs for the report's end-to-end tests: a tiny digits scenario of two
rounds in one process, written to `root/<setting>/<label or method>/seed<N>`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.terminal.live_view import QuietObserver
from tests.conftest import tiny_scenario


def simulate(
    root: Path, setting: str, method: str, seed: int, label: str | None = None,
    method_sections: dict[str, Any] | None = None, **sections: Any,
) -> Path:  # fmt: skip
    """One finished run; `method_sections` are the algorithm's sections beside its name
    (e.g. {"pacfl": {...}}), `label` its output.label, `sections` the scenario's others."""
    if label:
        sections["output"] = {"label": label}
    scenario = tiny_scenario(
        name=setting, seed=seed, algorithm={"name": method, **(method_sections or {})},
        protocol={"rounds": 2, **sections.pop("protocol", {})}, runtime={"backend": "local"}, **sections,
    )  # fmt: skip
    run_dir = root / setting / (label or method) / f"seed{seed}"
    run_simulation(prepare_run(build_scenario(scenario)), run_dir, QuietObserver())
    return run_dir
