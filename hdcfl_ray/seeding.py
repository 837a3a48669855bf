"""Every random stream of a run, named and derived from the run's one seed.

A stream is numpy's `SeedSequence([seed, *keys, TAG])`: the run seed, the
stream's keys (round, client, refresh, model...) and the stream's own tag.
Two streams with different names never share entropy, and since the seed is
never combined arithmetically with anything, the streams of seed 42 share
nothing with those of seed 1042 (an additive `seed + 1000 * i` would make seed
42's first cluster model seed 1042's global model). tests/test_seeding.py
checks both.

The dataset subset and the partition draw from `SeedSequence(seed).spawn(2)`
(`data_streams`); the global model is initialised from `torch.manual_seed(seed)`
(`model_init_seed(seed, 0)`). Both keep the layout they had before the streams
were named, so that runs stay identical to earlier ones.
"""

from __future__ import annotations

import numpy as np

STREAM_TAGS: dict[str, int] = {
    "sampling": 0x5A3,  # clients drawn per synchronous round (keys: round)
    "availability": 0xA7A1,  # which clients are online (keys: round)
    "async_dispatch": 0xA5C,  # the idle client the asynchronous server dispatches (keys: dispatch)
    "clock": 0xC10C,  # client speeds and delays of the virtual clock (no keys)
    "batches": 0x7EA1,  # a client's batch order in one round (keys: client, round)
    "augmentation": 0xA6E7,  # a client's training-time crops and flips in one round (keys: client, round)
    "client": 0xC11E,  # a method's client-side draws (keys: client, round; sub: the method's own stream)
    "fedsoft_selection": 0x50F7,  # FedSoft's per-centre client draws (keys: round)
    "ifca_assignment": 0x1FCA,  # the fixed subset IFCA scores cluster models on (keys: client)
    "init": 0x1417,  # initial weights of the further models of cluster methods (keys: model)
    "kmeans": 0x6EA5,  # HDC-FL's k-means at a refresh (keys: refresh)
    "pretrain_pool": 0x9001,  # which training images the pretraining pool holds (seed: dataset.pretrain_pool_seed)
    "validation_split": 0x7A11,  # which training images each client holds out for validation (keys: client)
    "sample_split": 0x5A5B,  # which windows a speaking role of shakespeare_plays holds out as its test set (keys: a digest of the role)
    "feature_shift": 0xFE5F,  # the noise of a client's feature shift (keys: client, split 0 train / 1 test)
    "pretrain": 0x97E7,  # `hdcfl-ray pretrain`'s batch order and rotations (keys: epoch)
    "eval_clients": 0xE7A1,  # the clients protocol.eval_clients scores at every evaluated round (no keys)
    "newcomers": 0x9E3C,  # which clients partition.newcomers holds out of training (no keys)
    "dp-poisson": 0xD9F5,  # privacy.sampling: poisson, which clients join a synchronous round (keys: round)
    "privacy_noise": 0xD9A0,  # the Gaussian noise of a privacy release (keys: round, release slot)
    "privacy_head_sketch": 0xD95C,  # HDC-FL's public sketch directions under privacy (keys: head length, rank)
    "privacy_seeding": 0xD95E,  # HDC-FL's k-means restarts on the released seeding bins under privacy (keys: round)
}


def seed_sequence(seed: int, name: str, *keys: int, sub: int | None = None) -> np.random.SeedSequence:
    """The named stream `name` of run `seed` at `keys` (`sub` splits a stream further)."""
    entropy = [int(seed), *(int(key) for key in keys), STREAM_TAGS[name]]
    if sub is not None:
        entropy.append(int(sub))
    return np.random.SeedSequence(entropy)


def rng(seed: int, name: str, *keys: int, sub: int | None = None) -> np.random.Generator:
    """A numpy generator on the named stream."""
    return np.random.default_rng(seed_sequence(seed, name, *keys, sub=sub))


def int_seed(seed: int, name: str, *keys: int) -> int:
    """A 32-bit integer from the named stream, for libraries that take an int (torch, scikit-learn)."""
    return int(seed_sequence(seed, name, *keys).generate_state(1)[0])


def model_init_seed(seed: int, model: int) -> int:
    """The torch seed of model `model`'s initial weights: the run seed for the
    global model (0), the `init` stream for each further model of a cluster method."""
    return int(seed) if model == 0 else int_seed(seed, "init", model)


def data_streams(seed: int) -> tuple[np.random.SeedSequence, np.random.SeedSequence]:
    """The train and test streams of the dataset subset and the partition."""
    train, test = np.random.SeedSequence(int(seed)).spawn(2)
    return train, test
