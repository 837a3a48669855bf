"""Every method runs end to end on Ray and logs the same per-client columns."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from hdcfl_ray.algorithms.registry import method_names
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.terminal.live_view import QuietObserver
from tests.conftest import SMALL_FEDERATION_METHODS, slow_beyond, tiny_scenario

pytestmark = pytest.mark.usefixtures("ray_session")

CLUSTERED = {"fedce", "fedsoft", "ifca", "pacfl", "hdcfl"}


# every registered method, a new one included; three in the README's test command (HDC-FL's object
# references, PACFL's probe of every client, Ditto's two models per client), the rest in the slow tier
@pytest.mark.parametrize("name", slow_beyond(method_names(), fast={"hdcfl", "pacfl", "ditto"}))
def test_method_runs_on_ray_and_logs_every_client(tmp_path, name):
    algorithm = {"name": name, **SMALL_FEDERATION_METHODS}
    scenario = build_scenario(tiny_scenario(algorithm=algorithm, protocol={"rounds": 2}))
    run_dir = tmp_path / name
    run_simulation(prepare_run(scenario), run_dir, QuietObserver())
    clients = pq.read_table(run_dir / "clients.parquet").to_pydict()
    assert sorted(zip(clients["round"], clients["client_id"])) == [(r, k) for r in (1, 2) for k in range(8)]
    assert all(0.0 <= a <= 1.0 for a in clients["accuracy"])
    if name in CLUSTERED:
        final_groups = [g for r, g in zip(clients["round"], clients["group"]) if r == 2]
        assert all(group is not None for group in final_groups)
    rounds = pq.read_table(run_dir / "rounds.parquet").to_pydict()
    assert rounds["round"] == [1, 2]
