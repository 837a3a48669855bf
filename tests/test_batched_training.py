"""Batched training (runtime.batched_training) equals training each client alone.

Stated tolerances (CPU, float32):
* small CNN (no BatchNorm), whole local updates of clients with unequal sample
  counts: every weight within 1e-6 of the one-at-a-time weight (measured: 3e-8);
  step and sample counts exact; mean losses within 1e-6 relative.
* ResNet-18 (BatchNorm), torch's own CPU kernels: weights within 1e-4 of the
  update's size, BatchNorm statistics within 1e-5. With oneDNN (torch's default
  CPU convolutions) the kernels differ by shape, so one step of either path is
  held to 3% of the update against a float64 step (each was measured up to about
  1% off; BatchNorm on small batches amplifies rounding).
* every method, a short run on digits: per-client test losses within 1e-3
  relative and accuracies within one test image of the one-at-a-time run.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

import hdcfl_ray
from hdcfl_ray.algorithms.registry import method_names
from hdcfl_ray.contract import LinearTerm, OptimizerConfig, ProximalPull
from hdcfl_ray.models import SplitModel
from hdcfl_ray.models.resnet_cifar import ResNet18Cifar
from hdcfl_ray.models.small_cnn import SmallCNN
from hdcfl_ray.runtime.client import batched_training
from hdcfl_ray.runtime.client.batched_training import TrainRequest, train_together
from hdcfl_ray.training.local_training import train_locally
from hdcfl_ray.runtime.client.training_rendezvous import TrainingRendezvous
from tests.conftest import SMALL_FEDERATION_METHODS, slow_beyond, tiny_scenario

SGD = OptimizerConfig(name="sgd", lr=0.05, momentum=0.9, weight_decay=5e-4)
# methods whose local update trains through its own loop, not ClientContext.train (docs/running.md)
ONE_AT_A_TIME = {"apfl"}


def small_model(seed: int = 0) -> SplitModel:
    torch.manual_seed(seed)
    return SplitModel(SmallCNN(1, width=8, feature_dim=32), nn.Linear(32, 10))


def learnable_data(sizes: list[int], shape: tuple[int, ...], seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    data = []
    for size in sizes:
        labels = torch.randint(0, 10, (size,), generator=generator)
        images = torch.randn(size, *shape, generator=generator) * 0.5 + labels.view(-1, *[1] * len(shape)).float() / 5
        data.append((images, labels))
    return data


def flat(model: SplitModel) -> torch.Tensor:
    return torch.cat([p.detach().double().flatten() for p in model.parameters()])


def alone_and_together(base: SplitModel, data, **options):
    """Each client trained alone (train_locally) and all trained together, from `base`."""
    alone, requests = [], []
    for client, (images, labels) in enumerate(data):
        model = copy.deepcopy(base)
        stats = train_locally(model, images, labels, generator=torch.Generator().manual_seed(client), **options)
        alone.append((model, stats))
        requests.append(
            TrainRequest(
                model=copy.deepcopy(base),
                inputs=images,
                labels=labels,
                generator=torch.Generator().manual_seed(client),
                epochs=options["epochs"],
                batch_size=options["batch_size"],
                optimizer_config=options["optimizer_config"],
                train_head=options.get("train_head", True),
                train_encoder=options.get("train_encoder", True),
                regulariser=options.get("regulariser"),
                sample_weights=options.get("sample_weights"),
            )
        )
    together = train_together(requests)
    return alone, [(request.model, stats) for request, stats in zip(requests, together)]


def assert_same_training(alone, together, tolerance: float = 1e-6) -> None:
    for (model_a, stats_a), (model_b, stats_b) in zip(alone, together):
        assert (stats_a.steps, stats_a.samples_processed, stats_a.num_samples, stats_a.nonfinite) == (
            stats_b.steps,
            stats_b.samples_processed,
            stats_b.num_samples,
            stats_b.nonfinite,
        )
        assert stats_b.mean_loss == pytest.approx(stats_a.mean_loss, rel=1e-6, nan_ok=True)
        assert float((flat(model_a) - flat(model_b)).abs().max()) <= tolerance


def test_clients_with_unequal_data_train_together_as_each_trains_alone() -> None:
    # 20 and 13 samples end their epochs on batches of 4 and 5; 5 samples fit in one short batch
    data = learnable_data([20, 20, 13, 5], (1, 8, 8))
    alone, together = alone_and_together(small_model(), data, epochs=2, batch_size=8, optimizer_config=SGD)
    assert_same_training(alone, together)
    # and every client really moved
    assert all(float((flat(m) - flat(small_model())).abs().max()) > 1e-3 for m, _ in together)


def test_a_frozen_part_stays_exactly_as_loaded() -> None:
    base = small_model()
    data = learnable_data([16, 9], (1, 8, 8))
    for frozen in ("head", "encoder"):
        options = {"train_head": frozen != "head", "train_encoder": frozen != "encoder"}
        alone, together = alone_and_together(base, data, epochs=1, batch_size=4, optimizer_config=SGD, **options)
        assert_same_training(alone, together)
        for model, _ in together:
            kept, original = getattr(model, frozen), getattr(base, frozen)
            assert all(torch.equal(a, b) for a, b in zip(kept.parameters(), original.parameters()))


def test_a_proximal_pull_and_per_sample_weights_train_batched_as_alone() -> None:
    base = small_model()
    anchor = [torch.zeros_like(p) for p in base.parameters()]
    pull = ProximalPull(targets=anchor, strength=0.5, total_importance=1.0, spread=0.25)
    data = learnable_data([12, 12, 7], (1, 8, 8))
    alone, together = alone_and_together(base, data, epochs=2, batch_size=4, optimizer_config=SGD, regulariser=pull)
    assert_same_training(alone, together)
    # the pull is felt: weights end nearer zero than without it
    free_alone, _ = alone_and_together(base, data, epochs=2, batch_size=4, optimizer_config=SGD)
    assert flat(together[0][0]).norm() < flat(free_alone[0][0]).norm()


def test_a_linear_term_with_each_clients_own_vector_trains_batched_as_alone() -> None:
    """SCAFFOLD's correction: every client has its own c - c_k; batched, each step's
    gradient gains the client's own vector, as alone."""
    base = small_model()
    data = learnable_data([12, 12, 7], (1, 8, 8))
    generator = torch.Generator().manual_seed(5)
    terms = [LinearTerm(targets=[0.5 * torch.randn(p.shape, generator=generator) for p in base.parameters()]) for _ in data]
    alone, requests = [], []
    for client, ((images, labels), term) in enumerate(zip(data, terms)):
        model = copy.deepcopy(base)
        stats = train_locally(model, images, labels, epochs=2, batch_size=4, optimizer_config=SGD, generator=torch.Generator().manual_seed(client), regulariser=term)
        alone.append((model, stats))
        requests.append(TrainRequest(copy.deepcopy(base), images, labels, 2, 4, SGD, torch.Generator().manual_seed(client), regulariser=term))
    stats = train_together(requests)
    assert [s.trained_together for s in stats] == [3, 3, 3]
    assert_same_training(alone, [(r.model, s) for r, s in zip(requests, stats)])
    # the terms are felt: each client ends elsewhere than without its own
    free_alone, _ = alone_and_together(base, data, epochs=2, batch_size=4, optimizer_config=SGD)
    assert all(not torch.allclose(flat(a[0]), flat(f[0])) for a, f in zip(alone, free_alone))


def test_per_sample_weights_train_batched_as_alone() -> None:
    base = small_model()
    data = learnable_data([10, 10], (1, 8, 8))
    weights = torch.linspace(0.0, 1.0, 10)
    alone, requests = [], []
    for client, (images, labels) in enumerate(data):
        model = copy.deepcopy(base)
        stats = train_locally(
            model, images, labels, epochs=2, batch_size=4, optimizer_config=SGD,
            generator=torch.Generator().manual_seed(client), sample_weights=weights,
        )
        alone.append((model, stats))
        requests.append(TrainRequest(copy.deepcopy(base), images, labels, 2, 4, SGD, torch.Generator().manual_seed(client), sample_weights=weights))
    together = [(r.model, s) for r, s in zip(requests, train_together(requests))]
    assert_same_training(alone, together)


def test_a_diverging_client_stops_at_its_epochs_end_without_touching_the_others() -> None:
    base = small_model()
    data = learnable_data([16, 16], (1, 8, 8))
    data[1] = (data[1][0] * float("inf"), data[1][1])  # client 1's loss is NaN from its first batch
    alone, together = alone_and_together(base, data, epochs=3, batch_size=4, optimizer_config=SGD)
    assert together[1][1].nonfinite and together[1][1].steps == 4  # one epoch of four batches, then it stopped
    assert np.isnan(together[1][1].mean_loss)
    assert_same_training(alone[:1], together[:1])


@pytest.fixture
def one_torch_thread():
    """One torch thread, as a host trains with by default: with more, MKL's products
    (not held to STRICT here) split their sums by the thread count and the two paths
    round apart (a client's batch of one sample through BatchNorm amplifies it: 0.5% of
    the update at two threads on an AMD EPYC), whatever order the suite runs tests in."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN")
def test_resnet_clients_train_batched_as_each_trains_alone(one_torch_thread: None) -> None:
    """With torch's own CPU kernels (oneDNN off) both paths round alike, so batched
    training is held tightly to training alone, BatchNorm statistics included."""
    torch.manual_seed(0)
    base = SplitModel(ResNet18Cifar(3), nn.Linear(512, 10))
    data = learnable_data([12, 12, 7], (3, 16, 16))
    with torch.backends.mkldnn.flags(enabled=False):
        alone, together = alone_and_together(base, data, epochs=1, batch_size=6, optimizer_config=SGD)
    for (model_alone, stats_alone), (model_together, stats_together) in zip(alone, together):
        update = float((flat(model_alone) - flat(base)).norm())
        assert float((flat(model_alone) - flat(model_together)).norm()) / update < 1e-4
        assert stats_together.mean_loss == pytest.approx(stats_alone.mean_loss, rel=1e-5)
        statistics_alone = torch.cat([b.double().flatten() for b in model_alone.encoder.buffers()])
        statistics_together = torch.cat([b.double().flatten() for b in model_together.encoder.buffers()])
        assert float((statistics_alone - statistics_together).abs().max()) < 1e-5


def test_resnet_steps_batched_with_onednn_stay_as_near_float64_as_alone() -> None:
    """oneDNN's float32 convolutions pick their algorithm by shape, so a client's
    step rounds differently alone and in a group: each path is sometimes off the
    float64 step by up to about 1% of the update (measured on an Intel Xeon with
    AMX, in either path). Both are held to 3% of the float64 update."""
    torch.manual_seed(0)
    base = SplitModel(ResNet18Cifar(3), nn.Linear(512, 10))
    data = learnable_data([8, 8, 8], (3, 16, 16))
    options = {"epochs": 1, "batch_size": 8, "optimizer_config": SGD}
    alone, together = alone_and_together(base, data, **options)
    for client, (images, labels) in enumerate(data):
        reference = copy.deepcopy(base)
        reference.encoder.double()
        reference.head.double()
        train_locally(reference, images.double(), labels, generator=torch.Generator().manual_seed(client), **options)
        update = float((flat(reference) - flat(base)).norm())
        error_alone = float((flat(alone[client][0]) - flat(reference)).norm()) / update
        error_together = float((flat(together[client][0]) - flat(reference)).norm()) / update
        assert error_alone < 3e-2 and error_together < 3e-2, (client, error_alone, error_together)


def test_a_failing_client_update_is_raised_and_leaves_no_thread_behind() -> None:
    import threading

    before = threading.active_count()

    def update(client: int):
        def run(slot):
            if client == 1:
                raise RuntimeError("client 1 broke")
            return slot.train(
                TrainRequest(small_model(), *learnable_data([8], (1, 8, 8))[0], 1, 4, SGD, torch.Generator().manual_seed(client))
            )

        return run

    rendezvous = TrainingRendezvous(train_together, thread_scope=lambda: __import__("contextlib").nullcontext())
    with pytest.raises(RuntimeError, match="client 1 broke"):
        rendezvous.run([update(0), update(1), update(2)])
    assert threading.active_count() == before


def client_rows(run_dir: Path) -> dict[tuple[int, int], tuple[float, float]]:
    table = pq.read_table(run_dir / "clients.parquet").to_pylist()
    return {(row["round"], row["client_id"]): (row["accuracy"], row["loss"]) for row in table}


@pytest.mark.parametrize("method", slow_beyond(sorted(method_names()), fast={"hdcfl", "fedavg", "ifca", "fedrep", "scaffold", "fedsoft"}))
def test_every_method_gives_the_same_results_batched_and_one_at_a_time(method: str, tmp_path: Path, write_scenario, monkeypatch) -> None:
    calls: list[int] = []
    real = batched_training.train_together

    def counted(requests):
        calls.append(len(requests))
        return real(requests)

    monkeypatch.setattr(batched_training, "train_together", counted)
    algorithm = {"name": method, **({method: SMALL_FEDERATION_METHODS[method]} if method in SMALL_FEDERATION_METHODS else {})}
    rows = {}
    for batched in (False, True):
        scenario = tiny_scenario(
            algorithm=algorithm,
            protocol={"rounds": 2, "participation": 1.0, "local_epochs": 1, "batch_size": 16},
            partition={"kind": "rotation", "num_clients": 6, "angles": [0, 180], "test_per_client": 30},
            runtime={"backend": "local", "num_cpus": 1, "batched_training": batched},
            output={"dir": str(tmp_path / f"batched-{batched}")},
            checkpoint={"every": None},
        )
        run = hdcfl_ray.simulate(write_scenario(scenario, f"{batched}.yaml"), progress=False)
        rows[batched] = client_rows(run.dir)
    assert rows[True].keys() == rows[False].keys()
    for key, (accuracy, loss) in rows[False].items():
        batched_accuracy, batched_loss = rows[True][key]
        assert abs(batched_accuracy - accuracy) <= 1 / 30 + 1e-9, (key, accuracy, batched_accuracy)
        assert batched_loss == pytest.approx(loss, rel=1e-3), key
    if method in ONE_AT_A_TIME:
        assert calls == []
    else:
        assert calls and max(calls) >= 2, f"{method} never trained two clients together: {calls}"


def test_two_batched_runs_are_bit_identical(tmp_path: Path, write_scenario) -> None:
    rows = []
    for attempt in range(2):
        scenario = tiny_scenario(
            protocol={"rounds": 2, "participation": 1.0, "local_epochs": 1, "batch_size": 16},
            runtime={"backend": "local", "num_cpus": 1, "batched_training": True},
            output={"dir": str(tmp_path / str(attempt))},
            checkpoint={"every": None},
        )
        rows.append(client_rows(hdcfl_ray.simulate(write_scenario(scenario, f"{attempt}.yaml"), progress=False).dir))
    assert rows[0] == rows[1]
