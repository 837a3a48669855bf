"""The batched trainer's step loop never makes the host wait for the device: every
client's batch order is drawn and every index tensor built before the first step, in
one transfer, and losses and finiteness stay on the device until the update ends
(benchmarks/host_syncs.py counts, on the CPU, what would stall a GPU)."""

from __future__ import annotations

import torch

from hdcfl_ray.contract import OptimizerConfig, ProximalPull
from hdcfl_ray.runtime.client import batched_training
from hdcfl_ray.runtime.client.batched_training import TrainRequest, train_together
from benchmarks.host_syncs import HostSyncCounter
from tests.test_batched_training import learnable_data, small_model

SGD = OptimizerConfig(name="sgd", lr=0.05, momentum=0.9, weight_decay=5e-4)


def test_the_counter_sees_what_would_stall_a_gpu() -> None:
    with HostSyncCounter() as counter:
        values = torch.arange(6.0)
        torch.as_tensor([1, 2])  # host data to the device
        _ = values[values > 2]  # a boolean mask: its size is read back
        values.sum().item()
        values.tolist()
        torch.randperm(4, generator=torch.Generator().manual_seed(0))  # drawn on the host
        bool(values.sum() > 0)
    assert len(counter.syncs) >= 6, counter.syncs


def test_the_batched_step_loop_never_waits_for_the_device(monkeypatch) -> None:
    """Unequal clients (steps of several batch sizes, clients that finish early), sample
    weights and a proximal pull: the loop's every operation stays on the device."""
    seen: list[list[str]] = []
    loop = batched_training.run_steps

    def counted(groups, state, data, loss_log):  # type: ignore[no-untyped-def]
        with HostSyncCounter() as counter:
            loop(groups, state, data, loss_log)
        seen.append(counter.syncs)
        return None

    monkeypatch.setattr(batched_training, "run_steps", counted)
    base = small_model()
    data = learnable_data([50, 37, 64, 20], (1, 8, 8))
    targets = [p.detach().clone() for p in (*base.encoder.parameters(), *base.head.parameters())]
    requests = [
        TrainRequest(
            model=small_model(),
            inputs=images,
            labels=labels,
            epochs=2,
            batch_size=16,
            optimizer_config=SGD,
            generator=torch.Generator().manual_seed(client),
            regulariser=ProximalPull(targets=targets, strength=0.5, total_importance=1.0, spread=0.25),
            sample_weights=torch.rand(len(labels), generator=torch.Generator().manual_seed(10 + client)),
        )
        for client, (images, labels) in enumerate(data)
    ]
    stats = train_together(requests)
    assert [s.steps for s in stats] == [8, 6, 8, 4] and all(s.mean_loss > 0 for s in stats)
    assert seen == [[]], f"the step loop waited for the device: {seen}"
