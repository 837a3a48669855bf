"""hdcfl-ray: a federated-learning simulator on Ray for personalised FL research.

The Python API (docs/python-api.md):

    import hdcfl_ray
    run = hdcfl_ray.simulate("scenarios/quickstart.yaml", overrides={"protocol.rounds": 5})
    run.final["mean_accuracy"]; run.rounds; run.clients   # pyarrow Tables
    hdcfl_ray.load_run(run.dir); hdcfl_ray.sweep([...], out="runs/grid"); hdcfl_ray.report([run.dir])

Bad input raises `hdcfl_ray.ScenarioError`. The functions are imported on first
use, so `import hdcfl_ray` loads neither torch nor Ray.
"""

from __future__ import annotations

from hdcfl_ray.errors import ScenarioError

__version__ = "0.1.0"
__all__ = ["Run", "ScenarioError", "SweepResult", "load_run", "report", "simulate", "sweep"]

_API_NAMES = frozenset({"Run", "SweepResult", "load_run", "report", "simulate", "sweep", "resolve_scenario"})


def __getattr__(name: str) -> object:
    if name in _API_NAMES:
        from hdcfl_ray import api

        return getattr(api, name)
    raise AttributeError(f"module 'hdcfl_ray' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
