"""A batched round's weights move between host and device for all clients at once
(runtime/client/replica_weights.py): loads are staged in one host buffer and stacked
with one transfer, and on CUDA the trained weights come back in one transfer, checked
finite on the device. Only copies change, so every upload, state and loss is the same
bytes as loading and flattening each client's replica; the CUDA path is run here on
the CPU (`HOST_COPY_DEVICES`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import numpy as np
import pytest
import torch

from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.contract import ClientTask, ModelParams, Upload
from hdcfl_ray.models import flatten_module, load_flat_into
from hdcfl_ray.runtime.backends.local_host import in_process_run, local_host
from hdcfl_ray.runtime.client import replica_weights
from hdcfl_ray.runtime.client.client_context import HostClientContext
from hdcfl_ray.runtime.client.replica_weights import StagingRows
from hdcfl_ray.runtime.driver import prepare_run
from hdcfl_ray.runtime.initial_model import initial_parameters
from hdcfl_ray.runtime.server.messages import ClientJob
from hdcfl_ray.training.local_training import evaluate
from tests.conftest import SMALL_FEDERATION_METHODS, tiny_scenario

# per_client: every load and snapshot through the replica (the path before staging);
# staged: the CPU's path; one_host_copy: CUDA's (one copy back, finiteness on the device)
MODES = ("per_client", "staged", "one_host_copy")


def _scenario(method: str, **runtime: Any) -> Any:
    algorithm = {"name": method, **({method: SMALL_FEDERATION_METHODS[method]} if method in SMALL_FEDERATION_METHODS else {})}
    return build_scenario(
        tiny_scenario(
            algorithm=algorithm,
            # unequal clients: their epochs end on batches of other sizes
            partition={"kind": "dirichlet", "alpha": 0.5, "num_clients": 4, "test_per_client": 20},
            protocol={"rounds": 2, "participation": 1.0, "local_epochs": 1, "batch_size": 16},
            runtime={"backend": "local", "num_cpus": 1, "batched_training": True, **runtime},
            checkpoint={"every": None},
        )
    )


def _use(mode: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Switch to `mode`; returns counts of the staged stacking and of the one host copy."""
    calls = {"stacked_from_rows": 0, "one_host_copy": 0}
    if mode == "per_client":
        monkeypatch.setattr(StagingRows, "for_model", classmethod(lambda cls, *args: None))
    if mode == "one_host_copy":
        monkeypatch.setattr(replica_weights, "HOST_COPY_DEVICES", frozenset({"cpu", "cuda"}))
    for name, key in (("stacked_weights_to_device", "stacked_from_rows"), ("take_trained_rows", "one_host_copy")):
        real = getattr(replica_weights, name)

        def counted(*args: Any, _real: Callable[..., Any] = real, _key: str = key) -> Any:
            calls[_key] += 1
            return _real(*args)

        monkeypatch.setattr(replica_weights, name, counted)
    return calls


def _bits(value: Any) -> Any:
    """Everything a value holds, as bytes and exact text (NaN included)."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return (str(value.dtype), value.shape, value.tobytes())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__, tuple((f.name, _bits(getattr(value, f.name))) for f in dataclasses.fields(value)))
    if isinstance(value, Mapping):
        return tuple(sorted((str(key), _bits(item)) for key, item in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_bits(item) for item in value)
    if isinstance(value, float):
        return value.hex()
    return repr(value)


def _run_uploads(method: str, mode: str, monkeypatch: pytest.MonkeyPatch, **runtime: Any) -> tuple[list[Any], dict[str, int]]:
    """Every update of a two-round run: (round, client, accepted, loss, steps, values, models, state) as bits."""
    with monkeypatch.context() as patch:
        calls = _use(mode, patch)
        run = in_process_run(prepare_run(_scenario(method, **runtime)))
        recorded: list[Any] = []
        real = run.host.train_many

        def recording(round_index: int, jobs: list[ClientJob], object_refs: Mapping[str, Any]) -> list[Any]:
            flat = real(round_index, jobs, object_refs)
            for models, meta, state in zip(flat[0::3], flat[1::3], flat[2::3]):
                recorded.append((round_index, meta.client_id, meta.accepted, _bits(meta.train_loss), meta.steps, _bits(meta.values), _bits(models), _bits(state)))
            return flat

        run.host.train_many = recording  # type: ignore[method-assign]
        try:
            run.run_all()
        finally:
            run.close()
    return recorded, calls


@pytest.mark.parametrize(("method", "runtime"), [("fedavg", {}), ("fedavg", {"channels_last": True}), ("fedrep", {}), ("hdcfl", {}), ("fedprox", {})])
def test_staged_loads_and_one_host_copy_give_the_per_client_bytes(method: str, runtime: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """FedRep snapshots between two trainings and loads again; FedProx reads the model
    for its pull (its loads then go straight to the model); HDC-FL refreshes; channels_last
    stacks the convolutions' weights in another order."""
    results = {mode: _run_uploads(method, mode, monkeypatch, **runtime) for mode in MODES}
    reference, _ = results["per_client"]
    assert len({row[1] for row in reference}) == 4 and all(row[2] for row in reference)
    assert len({row[4] for row in reference if row[0] == 1}) > 1, "the clients should differ in their steps"
    for mode in ("staged", "one_host_copy"):
        uploads, calls = results[mode]
        assert uploads == reference, f"{method}: {mode} changed an upload"
        if method != "fedprox":  # FedProx's update reads the model before it trains: nothing stays staged
            assert calls["stacked_from_rows"] > 0, f"{method}: {mode} never stacked staged rows"
    host_copies = results["one_host_copy"][1]["one_host_copy"]
    assert host_copies == 0 if method == "fedprox" else host_copies > 0
    assert results["staged"][1]["one_host_copy"] == 0
    assert results["per_client"][1] == {"stacked_from_rows": 0, "one_host_copy": 0}


def _fedavg_host() -> tuple[Any, ModelParams, list[ClientJob]]:
    prepared = prepare_run(_scenario("fedavg"))
    host = local_host(prepared)
    jobs = [ClientJob(client_id, ClientTask(models=("global",))) for client_id in host.client_ids()]
    return host, initial_parameters(prepared.scenario, prepared.dataset), jobs


@pytest.mark.parametrize("mode", MODES)
def test_a_client_whose_training_turns_nan_is_rejected_and_the_others_accepted(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _use(mode, monkeypatch)
    vouched: list[bool] = []
    real_known = HostClientContext.known_finite

    def recorded(ctx: HostClientContext, array: np.ndarray) -> bool:
        vouched.append(real_known(ctx, array))
        return vouched[-1]

    monkeypatch.setattr(HostClientContext, "known_finite", recorded)
    host, initial, jobs = _fedavg_host()
    poisoned = host.client_ids()[1]
    inputs, _ = host._split_tensors(host.clients[poisoned], "train")
    inputs.mul_(float("inf"))  # the cached training tensor: its loss is NaN from the first batch
    flat = host.train_many(1, jobs, {"global": initial})
    accepted = {meta.client_id: meta.accepted for meta in flat[1::3]}
    assert accepted == {client_id: client_id != poisoned for client_id in host.client_ids()}
    poisoned_upload = flat[0::3][1]["model"]
    assert not poisoned_upload.is_finite()
    # on CUDA's path the finite uploads are not read again on the host; the NaN one is
    assert sum(vouched) == (6 if mode == "one_host_copy" else 0)


class _ReadsTheModel:
    """FedAvg's update, reading the model between load and training: `scores` scores the
    loaded model first, `keeps` holds the modules from before the load, `reads` reads
    `ctx.model` after it. Records what it saw."""

    def __init__(self, how: str) -> None:
        self.how = how
        self.seen: dict[int, Any] = {}

    def local_update(self, ctx: HostClientContext, state: None, task: ClientTask, objects: Mapping[str, Any]) -> tuple[Upload, None]:
        kept = ctx.model.encoder if self.how == "keeps" else None
        ctx.load(objects["global"])
        if self.how == "scores":
            score = ctx.score()
            self.seen[ctx.client_id] = (score.accuracy, score.loss)
        elif self.how == "keeps":
            self.seen[ctx.client_id] = flatten_module(kept)
        else:
            self.seen[ctx.client_id] = flatten_module(ctx.model.encoder)
        stats = ctx.train()
        return Upload(ctx.client_id, stats.num_samples, stats.mean_loss, stats.steps, models={"model": ctx.snapshot()}), None


@pytest.mark.parametrize("how", ["scores", "keeps", "reads"])
def test_a_method_reading_the_model_after_a_load_sees_the_loaded_weights(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    uploads = {}
    for mode in ("per_client", "staged"):
        with monkeypatch.context() as patch:
            _use(mode, patch)
            host, initial, jobs = _fedavg_host()
            for replica in host._model_replicas(len(jobs)):  # weights unlike the ones loaded
                for tensor in replica.encoder.parameters():
                    tensor.data.fill_(0.5)
            method = _ReadsTheModel(how)
            host.algorithm = method
            flat = host.train_many(1, jobs, {"global": initial})
            uploads[mode] = [_bits(models) for models in flat[0::3]]
        if how != "scores":
            assert all(np.array_equal(seen, initial.encoder) for seen in method.seen.values()), mode
            continue
        host.bind_thread()  # the clients' thread count: the same sums
        load_flat_into(host.model.encoder, initial.encoder, host.encoder_index)
        load_flat_into(host.model.head, initial.head, host.head_index)
        for client_id, (accuracy, loss) in method.seen.items():
            ctx = host.context(client_id, 1)
            inputs, labels = ctx.test_data()
            expected = evaluate(host.model, inputs, labels, own_classes=ctx.own_classes())
            assert (accuracy, loss) == (expected.accuracy, expected.loss), (mode, client_id)
    assert uploads["staged"] == uploads["per_client"]


@pytest.mark.parametrize("channels_last", [False, True])
def test_staged_rows_stack_as_stack_module_state_stacks_the_replicas(channels_last: bool) -> None:
    """Names, order, shapes, strides, dtypes and values (BatchNorm's statistics and batch
    counts included), for the leading rows and for rows in another order."""
    from torch import nn
    from torch.func import stack_module_state

    from hdcfl_ray.models import FlatIndex, SplitModel
    from hdcfl_ray.models.resnet_cifar import ResNet18Cifar
    from hdcfl_ray.runtime.client.batched_training import _Joined

    torch.manual_seed(0)
    replicas = []
    for client in range(3):
        model = SplitModel(ResNet18Cifar(3), nn.Linear(512, 10))
        if channels_last:
            model.encoder.to(memory_format=torch.channels_last)
        with torch.no_grad():
            for tensor in (*model.encoder.parameters(), *model.encoder.buffers(), *model.head.parameters()):
                tensor.add_(client + 1)  # every client its own values, batch counts too
        replicas.append(model)
    encoder_index, head_index = FlatIndex.of(replicas[0].encoder), FlatIndex.of(replicas[0].head)
    staging = StagingRows.for_model(replicas[0], encoder_index, head_index, 3)
    assert staging is not None
    for row, model in enumerate(replicas):
        staging.write(row, flatten_module(model.encoder), flatten_module(model.head))
    for rows in ([0, 1, 2], [0, 1], [2, 0]):
        chosen = [replicas[row] for row in rows]
        expected = stack_module_state([_Joined(m.encoder, m.head) for m in chosen])  # type: ignore[arg-type]
        got = staging.stacked(rows, chosen, torch.device("cpu"))
        for want, have in zip(expected, got):
            assert list(want) == list(have)
            for name in want:
                a, b = want[name], have[name]
                assert (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype), (rows, name)
                assert torch.equal(a, b), (rows, name)
    for row, model in enumerate(replicas):  # and each row reads back as its model flattens
        encoder, head = staging.read(row)
        assert encoder.tobytes() == flatten_module(model.encoder).tobytes() and head.tobytes() == flatten_module(model.head).tobytes()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (python -m pytest -m cuda on a GPU machine)")
@pytest.mark.parametrize("method", ["fedavg", "fedrep"])
def test_on_cuda_one_transfer_each_way_gives_the_per_client_bytes(method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pinned buffers, asynchronous copies and device-side finiteness of a CUDA host."""
    reference, _ = _run_uploads(method, "per_client", monkeypatch, num_gpus_per_actor=1.0)
    uploads, calls = _run_uploads(method, "staged", monkeypatch, num_gpus_per_actor=1.0)  # CUDA's own path
    assert calls["stacked_from_rows"] > 0 and calls["one_host_copy"] > 0
    assert uploads == reference
