"""An update holding NaN/Inf is rejected, logged with the client id, and never
reaches the global model."""

from __future__ import annotations

import dataclasses

import numpy as np

from hdcfl_ray.maths.aggregate import weighted_average
from hdcfl_ray.algorithms.fedavg_se import FedAvgSE
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.runtime.round_rows import RoundRowBuilder
from hdcfl_ray.runtime.backends.local_host import in_process_run
from hdcfl_ray.runtime.driver import prepare_run
from tests.conftest import tiny_scenario

POISONED = 2


class PoisonedFedAvgSE(FedAvgSE):
    """FedAvg-SE whose client 2 uploads a NaN encoder."""

    def local_update(self, ctx, state, task, objects):
        upload, new_state = super().local_update(ctx, state, task, objects)
        if ctx.client_id == POISONED:
            encoder = upload.models["encoder"].copy()
            encoder[0] = np.nan
            upload = dataclasses.replace(upload, models={"encoder": encoder})
        return upload, new_state


def test_a_nan_update_is_rejected_logged_and_not_averaged():
    prepared = prepare_run(build_scenario(tiny_scenario(algorithm={"name": "fedavg_se"})))
    run = in_process_run(prepared, algorithm=PoisonedFedAvgSE())
    head_before = run.host.client_states[POISONED].head.copy()
    report = run.run_round(1)

    state = run.server.state
    assert np.isfinite(state.global_encoder).all()
    assert POISONED not in state.cache
    accepted = [u for u in report.uploads if u.accepted]
    assert [u.client_id for u in report.uploads if not u.accepted] == [POISONED]
    expected = weighted_average([state.cache[u.client_id].encoder for u in accepted], [u.num_samples for u in accepted])
    assert np.array_equal(state.global_encoder, expected)
    # the rejected client keeps its previous state
    assert np.array_equal(run.host.client_states[POISONED].head, head_before)
    assert any(f"client {POISONED}" in event and "rejected" in event for event in report.events)
    statuses = {row["client_id"]: row["status"] for row in RoundRowBuilder.update_rows(report)}
    assert statuses[POISONED] == "rejected_nonfinite"
    assert all(status == "applied" for client, status in statuses.items() if client != POISONED)
