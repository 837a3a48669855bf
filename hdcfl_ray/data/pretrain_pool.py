"""The pretraining pool: training images held out of every client's data.

`dataset.pretrain_pool` names a fraction of the source's training split that no
client ever sees; `hdcfl-ray pretrain` trains an encoder on it centrally (this
project's CPU-scale stand-in for the paper's ImageNet initialisation). The pool
is drawn per class (stratified) from its own seed, `dataset.pretrain_pool_seed`,
before the run seed's subset and partition, so one pretrained file serves every
run seed of a setting and no seed's clients overlap it. (A source without a test
split of its own, e.g. digits, draws its test split from the run seed first; its
pool then differs between run seeds.)
"""

from __future__ import annotations

import dataclasses

import numpy as np

from hdcfl_ray import seeding
from hdcfl_ray.data.dataset import ImageDataset
from hdcfl_ray.data.sources.holdout import stratified_holdout


def pool_split(labels: np.ndarray, fraction: float, pool_seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(kept, pool): sorted indices into the training split; every class keeps at least one kept image."""
    return stratified_holdout(np.asarray(labels), fraction, seeding.int_seed(pool_seed, "pretrain_pool"))


def without_pool(dataset: ImageDataset, fraction: float, pool_seed: int) -> ImageDataset:
    """The dataset the clients share: the training split minus the pool."""
    kept, _ = pool_split(dataset.train_labels, fraction, pool_seed)
    return dataclasses.replace(dataset, train_images=dataset.train_images[kept], train_labels=dataset.train_labels[kept])


def only_pool(dataset: ImageDataset, fraction: float, pool_seed: int) -> ImageDataset:
    """The pool as the training split (the test split kept as is, for scoring the pretrained model)."""
    _, pool = pool_split(dataset.train_labels, fraction, pool_seed)
    return dataclasses.replace(dataset, train_images=dataset.train_images[pool], train_labels=dataset.train_labels[pool])
