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
from hdcfl_ray.algorithms.scaffold import CONTROL, Scaffold, ScaffoldParams
from hdcfl_ray.algorithms.scaffold_control import difference, linear_correction, parameter_masks, updated_control
from hdcfl_ray.contract import ModelParams
from hdcfl_ray.contract.optimizer import OptimizerConfig
from hdcfl_ray.maths.local_steps import momentum_step_count
from hdcfl_ray.models import flatten_module
from hdcfl_ray.models.flat import FlatIndex
from hdcfl_ray.training.local_training import client_generator, train_locally
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


def _split_model(seed: int) -> SimpleNamespace:
    torch.manual_seed(seed)
    encoder, head = nn.Sequential(nn.Linear(7, 5), nn.ReLU()), nn.Linear(5, 3)
    return SimpleNamespace(encoder=encoder, head=head)


def _flat(model: SimpleNamespace) -> ModelParams:
    return ModelParams(encoder=flatten_module(model.encoder), head=flatten_module(model.head))


def _pieces(params: ModelParams, model: SimpleNamespace) -> list[torch.Tensor]:
    """A flat ModelParams as tensors shaped like the model's parameters (encoder, then head)."""
    pieces = []
    for vector, module in ((params.encoder, model.encoder), (params.head, model.head)):
        start = 0
        for parameter in module.parameters():
            pieces.append(torch.from_numpy(vector[start : start + parameter.numel()].copy()).reshape(parameter.shape))
            start += parameter.numel()
        assert start == vector.size  # no buffers: the flat vector is the parameters in order
    return pieces


def _random_like(params: ModelParams, rng: np.random.Generator, scale: float) -> ModelParams:
    return ModelParams(*(scale * rng.standard_normal(v.size).astype(np.float32) for v in (params.encoder, params.head)))


def test_paired_scaffold_step_and_control_update_are_our_local_update_bit_for_bit() -> None:
    """Our SCAFFOLD client (scaffold.py: the LinearTerm on train_locally, then option II with
    K = the steps taken) against the adapter's corrected step on our batches and its control
    update with PFLlib's count num_batches x epochs (23 samples in batches of 4: 6 steps an
    epoch, the last one short)."""
    side = _module("pfllib_side")
    ours = _split_model(seed=11)
    start = _flat(ours)
    rng = np.random.default_rng(4)
    server, own = _random_like(start, rng, 0.3), _random_like(start, rng, 0.2)
    inputs, labels = torch.randn(23, 7), torch.arange(23) % 3
    seed, client_id, round_index, batch, epochs, lr = 42, 2, 3, 4, 2, 0.5
    ctx = SimpleNamespace(model=ours, encoder_index=FlatIndex.of(ours.encoder), head_index=FlatIndex.of(ours.head))
    stats = train_locally(
        ours, inputs, labels, epochs=epochs, batch_size=batch,
        optimizer_config=OptimizerConfig(name="sgd", lr=lr, momentum=0.0, weight_decay=0.0),
        generator=client_generator(seed, client_id, round_index), regulariser=linear_correction(ctx, difference(server, own)),
    )
    trained = _flat(ours)
    scale = momentum_step_count(stats.steps, 0.0) * lr  # as Scaffold.local_update
    new_own = updated_control(own, server, start, trained, parameter_masks(ctx), scale)

    theirs_parts = _split_model(seed=11)
    theirs = side.EncoderWithHead(theirs_parts.encoder, theirs_parts.head)
    c, c_k = _pieces(server, theirs_parts), _pieces(own, theirs_parts)
    x = [p.detach().clone() for p in theirs.parameters()]
    loader = side.PairedBatches(inputs, labels, batch, side.RoundPermutations(23, side.our_batch_generator(seed, client_id, round_index)))
    for _epoch in range(epochs):  # clientSCAFFOLD.train's loop
        for xb, yb in loader:
            loss = nn.CrossEntropyLoss()(theirs(xb), yb)
            for p in theirs.parameters():
                p.grad = None
            loss.backward()
            side.scaffold_corrected_step(list(theirs.parameters()), c, c_k, lr)
    assert len(loader) * epochs == stats.steps == 12
    np.testing.assert_array_equal(flatten_module(theirs), np.concatenate([trained.encoder, trained.head]))
    updated = side.scaffold_control_update(c_k, c, x, list(theirs.parameters()), len(loader) * epochs, lr)
    np.testing.assert_array_equal(torch.cat([u.reshape(-1) for u in updated]).numpy(), np.concatenate([new_own.encoder, new_own.head]))
    delta = difference(new_own, own)  # what our client uploads as Delta c
    np.testing.assert_array_equal(torch.cat([(u - o).reshape(-1) for u, o in zip(updated, c_k)]).numpy(),
                                  np.concatenate([delta.encoder, delta.head]))


@pytest.mark.parametrize(("server_lr", "uploading"), [(1.0, 5), (0.5, 5), (1.0, 3)])
def test_paired_scaffold_average_is_our_server_bit_for_bit(server_lr: float, uploading: int) -> None:
    side = _module("pfllib_side")
    model = _split_model(seed=2)
    x = _flat(model)
    rng = np.random.default_rng(9)
    method = Scaffold(ScaffoldParams(server_lr=server_lr))
    state = method.init_server(x, [], num_clients=5)
    state.control = _random_like(x, rng, 0.1)
    control = _pieces(state.control, model)
    ids = [4, 0, 3, 1, 2][:uploading]  # in PFLlib's (random) upload order
    ys = {k: _random_like(x, rng, 1.0) for k in ids}
    deltas = {k: _random_like(x, rng, 0.05) for k in ids}
    uploads = [SimpleNamespace(client_id=k, num_samples=72, train_loss=1.0, models={"model": ys[k], CONTROL: deltas[k]}) for k in ids]
    method.aggregate(state, 2, uploads)  # type: ignore[arg-type]
    new_model, new_control = side.scaffold_average(
        _pieces(x, model), control, [(k, _pieces(ys[k], model), _pieces(deltas[k], model)) for k in ids], 5, server_lr
    )
    for got, expected in ((new_model, state.model), (new_control, state.control)):
        np.testing.assert_array_equal(torch.cat([t.reshape(-1) for t in got]).numpy(), np.concatenate([expected.encoder, expected.head]))


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
    for method in ("fedprox", "ditto", "scaffold"):  # PFLlib's proximal and SCAFFOLD optimizers: no momentum, no weight decay
        assert {"protocol.optimizer.momentum=0", "protocol.optimizer.weight_decay=0"} <= set(run.METHOD_SETTINGS[method])


def test_the_full_run_band_is_one_point_or_two_standard_errors_of_the_paired_difference() -> None:
    run = _module("run")
    assert run.agreement_band([0.1, -0.1, 0.0]) == 1.0  # tight pairs: the 1 pp floor
    spread = [2.17, -0.11, 1.56]
    assert run.agreement_band(spread) == pytest.approx(2 * np.std(spread, ddof=1) / np.sqrt(3))
