"""What a run records about batched training and its hosts' GPUs.

* updates.parquet's `trained_together` is the size of the batched group a client's
  training stepped in (1 when it trained alone), not the number of clients its host ran;
* a run with batched training on that cannot batch (Adam, a method with its own
  training loop) says why, at start and in the manifest's `batching`;
* the manifest's `runtime.hosts` gives each host's device and GPU ids, and the local
  backend's `runtime.gpus` counts the GPUs its hosts train on (CUDA mocked here)."""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow.parquet as pq
import torch

import hdcfl_ray
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.config.schema import ProtocolConfig
from hdcfl_ray.contract import OptimizerConfig, TrainStats
from hdcfl_ray.models import FlatIndex
from hdcfl_ray.runtime.backends.host_gpus import host_gpus
from hdcfl_ray.runtime.backends.local_backend import LocalBackend
from hdcfl_ray.runtime.backends.placement import local_host_devices
from hdcfl_ray.runtime.batching_record import batching_at_start, batching_notices
from hdcfl_ray.runtime.client.batched_training import TrainRequest, train_together
from hdcfl_ray.runtime.client.client_context import HostClientContext
from tests.conftest import tiny_scenario
from tests.test_batched_training import SGD, learnable_data, small_model


def _run(tmp_path: Path, name: str, **sections: Any) -> Any:
    scenario = tiny_scenario(
        **{
            "algorithm": {"name": "fedavg"},
            "protocol": {"rounds": 2, "participation": 0.75, "local_epochs": 1, "batch_size": 16},
            **sections,
        }
    )
    return hdcfl_ray.simulate(scenario, out=tmp_path / name, progress=False)


def _updates(run: Any) -> list[dict[str, Any]]:
    return pq.read_table(run.dir / "updates.parquet").to_pylist()


# two hosts of four clients, batched: a round's participants on a host train as one group
TWO_BATCHED_HOSTS = {"backend": "local", "num_cpus": 2, "batched_training": True}


def test_trained_together_is_the_size_of_each_hosts_batched_group(tmp_path: Path) -> None:
    run = _run(tmp_path, "sgd", runtime=TWO_BATCHED_HOSTS)
    updates = _updates(run)
    per_host = Counter((row["round"], row["host"]) for row in updates)
    assert all(row["trained_together"] == per_host[row["round"], row["host"]] for row in updates), updates
    assert max(row["trained_together"] for row in updates) > 1
    assert run.manifest["batching"] == {"batched": True, "reason": None, "observed_max_trained_together": max(per_host.values())}
    assert not [notice for notice in run.notices if "batched_training" in notice]
    assert run.manifest["runtime"]["hosts"] == [{"host": 0, "device": "cpu", "gpu_ids": []}, {"host": 1, "device": "cpu", "gpu_ids": []}]
    assert run.manifest["runtime"]["gpus"] == 0.0


def test_adam_trains_every_client_alone_and_the_run_says_why(tmp_path: Path) -> None:
    adam = {"optimizer": {"name": "adam", "lr": 0.001}}
    run = _run(tmp_path, "adam", runtime=TWO_BATCHED_HOSTS, protocol=adam)
    assert {row["trained_together"] for row in _updates(run)} == {1}
    batching = run.manifest["batching"]
    assert batching["batched"] is False and batching["observed_max_trained_together"] == 1
    assert batching["reason"].startswith("protocol.optimizer.name: adam trains one client at a time")
    assert [notice for notice in run.notices if "batched_training" in notice] == [
        "runtime.batched_training is on, but protocol.optimizer.name: adam trains one client at a time (batched training runs SGD only)"
    ]


def test_a_method_with_its_own_training_loop_is_recorded_as_unbatched_after_the_run(tmp_path: Path) -> None:
    run = _run(tmp_path, "apfl", runtime=TWO_BATCHED_HOSTS, algorithm={"name": "apfl"}, protocol={"rounds": 1})
    assert {row["trained_together"] for row in _updates(run)} == {1}
    batching = run.manifest["batching"]
    assert batching["batched"] is False and batching["observed_max_trained_together"] == 1
    assert "its own loop" in batching["reason"]


def test_the_batching_record_at_start_follows_the_scenario() -> None:
    def scenario(**sections: Any):
        return build_scenario(tiny_scenario(**sections))

    assert batching_at_start(scenario(runtime={"batched_training": False})) == {
        "batched": False, "reason": "runtime.batched_training: false: it is off"
    }  # fmt: skip
    assert "no GPU" in batching_at_start(scenario(runtime={"batched_training": "auto"}))["reason"]
    assert batching_notices(scenario(runtime={"batched_training": "auto"}, protocol={"optimizer": {"name": "adam"}})) == []
    on = {"batched_training": True}
    assert batching_at_start(scenario(runtime=on)) == {"batched": True, "reason": None}
    assert "protocol.mode: async" in batching_at_start(scenario(runtime=on, protocol={"mode": "async"}, algorithm={"name": "fedavg"}))["reason"]


def test_train_together_gives_each_request_the_size_of_its_group() -> None:
    """Requests split by their settings (here epochs and batch size) into groups: three
    of one kind, two of another, one alone."""
    data = learnable_data([12, 9, 12, 7, 12, 10], (1, 8, 8))
    kinds = [(1, 4), (2, 4), (1, 4), (2, 4), (1, 8), (1, 4)]  # (epochs, batch size)
    base = small_model()
    requests = [
        TrainRequest(copy.deepcopy(base), images, labels, epochs, batch, SGD, torch.Generator().manual_seed(client))
        for client, ((images, labels), (epochs, batch)) in enumerate(zip(data, kinds))
    ]
    assert [stats.trained_together for stats in train_together(requests)] == [3, 2, 3, 2, 1, 3]
    assert [stats.trained_together for stats in train_together(requests[4:5])] == [1]


class _Slot:
    """A rendezvous slot that reports the given group sizes, one per `train` call."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes

    def train(self, request: TrainRequest) -> TrainStats:
        return TrainStats(mean_loss=0.5, num_samples=int(request.inputs.shape[0]), steps=1, nonfinite=False, trained_together=self.sizes.pop(0))


def _context(slot: _Slot | None, optimizer: OptimizerConfig = SGD) -> HostClientContext:
    model = small_model()
    images, labels = learnable_data([8], (1, 8, 8))[0]
    return HostClientContext(
        client_id=0, round_index=1, seed=0, model=model,
        encoder_index=FlatIndex.of(model.encoder), head_index=FlatIndex.of(model.head),
        protocol=ProtocolConfig(local_epochs=1, batch_size=4, optimizer=optimizer),
        generator=torch.Generator().manual_seed(0),
        _train_data=lambda: (images, labels), _test_data=lambda: (images, labels), _raw_train=lambda: (images.numpy(), labels.numpy()),
        _training_slot=slot,  # type: ignore[arg-type]
    )  # fmt: skip


def test_a_client_records_the_largest_group_any_of_its_train_calls_ran_in() -> None:
    ctx = _context(_Slot([3, 5, 2]))
    assert ctx.trained_together == 1
    for _ in range(3):  # e.g. FedRep: the head, then the encoder, then once more
        ctx.train()
    assert ctx.trained_together == 5
    alone = _context(_Slot([4]), optimizer=OptimizerConfig(name="adam", lr=0.001))
    alone.train()  # Adam never reaches the rendezvous
    assert alone.trained_together == 1


def test_each_hosts_gpus_are_recorded_alike_for_both_backends(monkeypatch) -> None:
    runtime = build_scenario(tiny_scenario(runtime={"backend": "local", "num_gpus_per_actor": 0.5})).runtime
    devices = local_host_devices(runtime, 8, cuda_devices=2)
    assert devices == [0, 0, 1, 1]
    local = [{"device": f"cuda:{device}", "granted_gpu_ids": None} for device in devices]
    assert host_gpus(local, environ={}) == [
        {"host": 0, "device": "cuda:0", "gpu_ids": ["0"]}, {"host": 1, "device": "cuda:0", "gpu_ids": ["0"]},
        {"host": 2, "device": "cuda:1", "gpu_ids": ["1"]}, {"host": 3, "device": "cuda:1", "gpu_ids": ["1"]},
    ]  # fmt: skip
    # the machine's ids where the process sees only some of its GPUs
    assert [host["gpu_ids"] for host in host_gpus(local, environ={"CUDA_VISIBLE_DEVICES": "3,5"})] == [["3"], ["3"], ["5"], ["5"]]
    # a Ray host computes on its cuda:0, the GPU Ray granted it; a CPU host has none
    ray_hosts = [{"device": "cuda:0", "granted_gpu_ids": ["2"]}, {"device": "cpu", "granted_gpu_ids": []}]
    assert host_gpus(ray_hosts) == [{"host": 0, "device": "cuda:0", "gpu_ids": ["2"]}, {"host": 1, "device": "cpu", "gpu_ids": []}]
    # the local backend's runtime.gpus: the GPUs its hosts train on, not 0
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    backend = LocalBackend.__new__(LocalBackend)
    backend.threads, backend.host_runtime = 16, runtime
    backend.run = SimpleNamespace(hosts=[SimpleNamespace(device=torch.device("cuda", device)) for device in devices])  # type: ignore[assignment]
    assert backend.describe()["gpus"] == 2.0
    backend.run = SimpleNamespace(hosts=[SimpleNamespace(device=torch.device("cpu"))])  # type: ignore[assignment]
    assert backend.describe()["gpus"] == 0.0
