"""A plugin method for tests/test_client_failure.py: FedAvg whose client 3 raises in
round 2, after its training has started."""

from hdcfl_ray.algorithms.fedavg import FedAvg
from hdcfl_ray.contract import MethodSpec


class FailingAvg(FedAvg):
    name = "failing_avg"

    def local_update(self, ctx, state, task, objects):  # type: ignore[no-untyped-def]
        upload, new_state = super().local_update(ctx, state, task, objects)
        if ctx.client_id == 3 and ctx.round_index == 2:
            raise ValueError("the client's data loader broke")
        return upload, new_state


METHOD = MethodSpec("failing_avg", "FedAvg whose client 3 fails in round 2", lambda params, run: FailingAvg())
