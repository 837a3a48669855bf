"""The paired mode of the cross-check (docs/cross-check.md) hands the reference our batches,
our batch order per phase and our server average. These check, without any reference code,
that the adapter's pieces reproduce ours bit for bit: studies/crosscheck/pfllib_side.py,
ifca_side.py and run.py import only torch and numpy (and our own code) at module level."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from hdcfl_ray import seeding
from hdcfl_ray.maths.aggregate import weighted_average
from hdcfl_ray.algorithms.apfl import BATCH_ORDER_STREAM
from hdcfl_ray.models import flatten_module
from hdcfl_ray.training.local_training import client_generator
from tests.script_modules import REPOSITORY, load_script

CROSSCHECK = REPOSITORY / "studies" / "crosscheck"


def _module(name: str):
    if str(CROSSCHECK) not in sys.path:
        sys.path.insert(0, str(CROSSCHECK))  # ifca_side and run_ifca import their siblings by name
    return load_script(CROSSCHECK / f"{name}.py", f"crosscheck_paired_{name}")


def _models(count: int, seed: int) -> list[nn.Module]:
    torch.manual_seed(seed)
    return [nn.Sequential(nn.Linear(7, 5), nn.ReLU(), nn.Linear(5, 3)) for _ in range(count)]


def test_paired_batches_are_the_batches_train_locally_cuts_epoch_by_epoch() -> None:
    side = _module("pfllib_side")
    inputs = torch.randn(23, 1, 8, 8).permute(0, 1, 3, 2)  # a non-default layout, kept by the indexing
    labels = torch.arange(23) % 10
    seed, client_id, round_index, batch, epochs = 42, 3, 5, 8, 2
    permutations = side.RoundPermutations(23, side.our_batch_generator(seed, client_id, round_index))
    loader = side.PairedBatches(inputs, labels, batch, permutations)
    ours = client_generator(seed, client_id, round_index)
    for _epoch in range(epochs):
        order = torch.randperm(23, generator=ours)
        expected = [(inputs[order[s : s + batch]], labels[order[s : s + batch]]) for s in range(0, 23, batch)]
        got = list(loader)
        assert len(got) == len(expected) == len(loader)
        for (x, y), (ex, ey) in zip(got, expected):
            assert torch.equal(x, ex) and torch.equal(y, ey) and x.stride() == ex.stride()
    # a phase that reads later epochs (Ditto's personal training after the global model's) sees them
    # even when it runs first, and the earlier epochs stay what they were
    later = side.RoundPermutations(23, side.our_batch_generator(seed, client_id, round_index))
    reference = client_generator(seed, client_id, round_index)
    expected_orders = [torch.randperm(23, generator=reference) for _ in range(4)]
    assert torch.equal(later.epoch(2), expected_orders[2]) and torch.equal(later.epoch(0), expected_orders[0])
    assert torch.equal(later.epoch(3), expected_orders[3]) and torch.equal(later.epoch(1), expected_orders[1])


def test_apfl_permutations_are_our_apfl_batch_order() -> None:
    side = _module("pfllib_side")
    assert side.NumpyRoundPermutations.APFL_BATCH_ORDER_STREAM == BATCH_ORDER_STREAM
    assert side.NumpyRoundPermutations.CLIENT_STREAM_TAG == seeding.STREAM_TAGS["client"]
    for seed, client_id, round_index in ((42, 0, 1), (2026, 19, 30)):
        ours = seeding.rng(seed, "client", client_id, round_index, sub=BATCH_ORDER_STREAM)  # ctx.numpy_rng(...)
        theirs = side.NumpyRoundPermutations(71, seed, client_id, round_index)
        for epoch in range(3):
            assert theirs.epoch(epoch).tolist() == ours.permutation(71).tolist()


def test_in_layout_keeps_the_values_and_takes_the_strides() -> None:
    side = _module("pfllib_side")
    array = np.random.default_rng(0).standard_normal((5, 1, 8, 8)).astype(np.float32)
    for strides in ([64, 64, 8, 1], [64, 1, 8, 1], [64, 1, 1, 8]):
        tensor = side.in_layout(array, strides)
        assert list(tensor.stride()) == strides
        np.testing.assert_array_equal(tensor.numpy(), array)


@pytest.mark.parametrize("split", [False, True])
def test_paired_average_is_our_weighted_average_bit_for_bit(split: bool) -> None:
    side = _module("pfllib_side")
    models = _models(5, seed=3)
    ids, samples = [4, 0, 3, 1, 2], [71, 72, 72, 71, 72]  # uploaded in a shuffled order, as PFLlib's clients train
    clients = []
    for client_id, model in zip(ids, models):
        holder = SimpleNamespace(base=model) if split else model  # FedPer/FedBABU/FedRep upload model.base
        clients.append(SimpleNamespace(id=client_id, model=holder))
    server = SimpleNamespace(
        clients=clients,
        uploaded_models=models,
        uploaded_weights=[n / sum(samples) for n in samples],
    )
    side.paired_average(server)
    by_id = sorted(range(5), key=lambda i: ids[i])
    expected = weighted_average([flatten_module(models[i]) for i in by_id], [samples[i] for i in by_id])
    np.testing.assert_array_equal(flatten_module(server.global_model), expected)


def test_ifca_side_average_is_our_cluster_average_bit_for_bit() -> None:
    ifca_side = _module("ifca_side")
    models = _models(3, seed=5)
    averaged = ifca_side.ours_average(models, [72.0, 72.0, 72.0])
    combined = _models(1, seed=0)[0]
    with torch.no_grad():
        for name, parameter in combined.named_parameters():
            parameter.copy_(averaged[name])
    expected = weighted_average([flatten_module(m) for m in models], [72, 72, 72])
    np.testing.assert_array_equal(flatten_module(combined), expected)


def test_paired_rows_count_identical_clients_and_the_largest_difference() -> None:
    run = _module("run")
    ours = {1: [0.5, 0.25], 2: [0.75, 0.5]}
    reference = [[0.1, 0.1], [0.5, 0.25], [0.75, 0.45]]
    rows = run.paired_rows(ours, reference, 2, {1: [1.0, 2.0], 2: [1.0, 2.0]}, [None, [1.0, 2.0], [1.0, 2.5]])
    assert [r["identical_clients"] for r in rows] == [2, 1]
    assert rows[1]["max_abs_difference"] == pytest.approx(0.05)
    assert [r["identical_losses"] for r in rows] == [2, 1]
    assert rows[1]["max_abs_loss_difference"] == 0.5


def test_each_pair_gets_its_own_export_when_it_has_settings_of_its_own(tmp_path: Path) -> None:
    run = _module("run")
    assert set(run.METHOD_SETTINGS) <= set(run.REFERENCE_NAMES)
    assert run.export_root(tmp_path, 42, "fedavg") == run.export_root(tmp_path, 42, "fedbabu")
    assert run.export_root(tmp_path, 42, "ditto") != run.export_root(tmp_path, 42, "fedavg")
    # --set comes last, so it wins over a pair's own setting
    assert run.method_overrides("fedprox", ["algorithm.fedprox.mu=0.5"])[-1] == "algorithm.fedprox.mu=0.5"
    for method in ("fedprox", "ditto"):  # PFLlib's proximal optimizer has no momentum and no weight decay
        assert {"protocol.optimizer.momentum=0", "protocol.optimizer.weight_decay=0"} <= set(run.METHOD_SETTINGS[method])


def test_the_full_run_band_is_one_point_or_two_standard_errors_of_the_paired_difference() -> None:
    run = _module("run")
    assert run.agreement_band([0.1, -0.1, 0.0]) == 1.0  # tight pairs: the 1 pp floor
    spread = [2.17, -0.11, 1.56]
    assert run.agreement_band(spread) == pytest.approx(2 * np.std(spread, ddof=1) / np.sqrt(3))
