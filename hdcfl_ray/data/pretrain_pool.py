"""The pretraining pool: training images held out of every client's data.

`dataset.pretrain_pool` names a fraction of the source's training split that no
client ever sees; `hdcfl-ray pretrain` trains an encoder on it centrally (this
project's CPU-scale stand-in for the paper's ImageNet initialisation). The pool
is a seeded random share of the training rows, drawn from its own seed
(`dataset.pretrain_pool_seed`) before the run seed's subset
(`dataset.max_train_samples`) and partition, so one pretrained file serves every
run seed of a setting and no seed's clients overlap it. It is drawn from row
positions alone, so a Parquet source picks it before decoding any image. (A
source without a test split of its own, e.g. digits, draws its splits from the
run seed first; its pool then differs between run seeds.)
"""

from __future__ import annotations

import math

import numpy as np

from hdcfl_ray import seeding


def pool_rows(size: int, fraction: float, pool_seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(kept, pool): sorted row indices of a training split of `size` rows; the pool
    holds ceil(fraction * size) of them, and at least one row is kept."""
    pool_size = min(size - 1, math.ceil(fraction * size))
    order = seeding.rng(pool_seed, "pretrain_pool").permutation(size)
    return np.sort(order[pool_size:]), np.sort(order[:pool_size])
