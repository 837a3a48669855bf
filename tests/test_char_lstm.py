"""The character model: ids survive the image path, the fused and stepwise LSTM agree, and
clients trained together (vmap) match clients trained one by one."""

from __future__ import annotations

import numpy as np
import torch
from torch.func import functional_call, stack_module_state, vmap

from hdcfl_ray.data.transforms import to_float_batch
from hdcfl_ray.models.char_lstm import CharLSTM, ids_from_batch


def _batch(size: int = 5, length: int = 9, seed: int = 0) -> tuple[np.ndarray, torch.Tensor]:
    ids = np.random.default_rng(seed).integers(0, 81, size=(size, length)).astype(np.uint8)
    return ids, to_float_batch(ids[:, :, None, None])


def test_character_ids_survive_the_image_path():
    ids, batch = _batch()
    assert batch.shape == (5, 1, 9, 1)
    assert torch.equal(ids_from_batch(batch), torch.from_numpy(ids).long())


def test_fused_and_stepwise_lstm_agree():
    torch.manual_seed(0)
    model = CharLSTM(feature_dim=12)
    _, batch = _batch()
    embedded = model.embedding(ids_from_batch(batch))
    torch.testing.assert_close(model(batch), model.stepwise(embedded), rtol=1e-5, atol=1e-6)


def test_clients_under_vmap_match_clients_one_by_one():
    torch.manual_seed(1)
    models = [CharLSTM(feature_dim=8) for _ in range(3)]
    params, buffers = stack_module_state(models)
    batches = torch.stack([_batch(seed=seed)[1] for seed in range(3)])

    def features(p, b, x):
        return functional_call(models[0], (p, b), (x,))

    together = vmap(features)(params, buffers, batches)
    for index, model in enumerate(models):
        torch.testing.assert_close(together[index], model(batches[index]), rtol=1e-5, atol=1e-6)
