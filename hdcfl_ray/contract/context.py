"""What a method's client hooks see inside a client host: the client's data, a
model skeleton to load flat vectors into, training and scoring with the run's
settings, and seeded generators. The runtime implements it
(hdcfl_ray/runtime/client/client_context.py); methods never touch Ray.

This module imports no torch at run time: tensor types appear in annotations only."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Hashable, Protocol

import numpy as np

from hdcfl_ray.contract.optimizer import OptimizerConfig
from hdcfl_ray.contract.values import EvalStats, ModelParams, TrainingBudget, TrainStats

if TYPE_CHECKING:
    import torch
    from torch import nn

    from hdcfl_ray.models.flat import FlatIndex

    TensorPair = tuple[torch.Tensor, torch.Tensor]
    # an extra loss term added to each batch's cross-entropy (e.g. a proximal pull)
    Regulariser = Callable[["ModelParts"], torch.Tensor]


class ModelParts(Protocol):
    """The model skeleton: an encoder (images -> features) and a linear head (features -> logits)."""

    encoder: nn.Module
    head: nn.Linear


class TrainingSettings(Protocol):
    """The protocol settings a client trains and is scored with."""

    local_epochs: int
    batch_size: int
    optimizer: OptimizerConfig
    eval_local_reference: bool  # score the client's own last-trained encoder too (shared-encoder methods)


class ClientContext(Protocol):
    client_id: int
    round_index: int
    seed: int
    model: ModelParts
    encoder_index: FlatIndex  # where each encoder parameter sits in a flat encoder vector
    head_index: FlatIndex
    protocol: TrainingSettings

    # ---- budget ----
    @property
    def budget(self) -> TrainingBudget: ...

    def count_training(self, samples: int, steps: int) -> None:
        """Record training a method runs outside `train` (e.g. FedALA's weight learning)."""

    # ---- data ----
    def train_data(self) -> TensorPair:
        """The client's training images (normalised, on its device) and labels."""

    def test_data(self) -> TensorPair: ...

    def training_batch(self, images: torch.Tensor) -> torch.Tensor:
        """A batch of the training images as local training sees it (the scenario's
        training-time augmentation applied, with the client's own draws for the round;
        `images` itself when the scenario has none). For a method that runs its own
        training loop; `train` applies it to every batch itself."""

    def raw_train(self) -> tuple[np.ndarray, np.ndarray]:
        """The training images as stored (uint8, N x H x W x C, after the client's rotation) and labels."""

    @property
    def num_train(self) -> int: ...

    def own_classes(self) -> torch.Tensor:
        """The classes present in the client's training data (sorted)."""

    def numpy_rng(self, stream: int = 0) -> np.random.Generator:
        """A numpy generator fixed by (seed, client, round, stream)."""

    # ---- weights ----
    def load(self, params: ModelParams, head: np.ndarray | None = None) -> None:
        """Load an encoder and a head (`head` overrides params.head) into the model."""

    def snapshot(self) -> ModelParams:
        """The loaded model as flat vectors."""

    # ---- training and scoring ----
    def train(
        self,
        *,
        epochs: int | None = None,
        train_head: bool = True,
        train_encoder: bool = True,
        data: TensorPair | None = None,
        optimizer: OptimizerConfig | None = None,
        regulariser: Regulariser | None = None,
        sample_weights: torch.Tensor | None = None,
    ) -> TrainStats:
        """Train the loaded model with the protocol's optimizer (fresh state) and batch size."""

    def score(self, params: ModelParams | None = None, head: np.ndarray | None = None, data: TensorPair | None = None) -> EvalStats:
        """Accuracy and loss on the client's test set (or `data`) of the given (or loaded) model.

        In `evaluate`, the score of a shared encoder (a broadcast object, or an array
        from `shared_array`) on the test set is computed later, together with the
        host's other clients: it reads like EvalStats (reading a field computes it at
        once), and `score(params)` then does not leave `params` loaded."""

    def shared_array(self, key: Hashable, build: Callable[[], np.ndarray]) -> np.ndarray:
        """An encoder derived from broadcast objects that several clients score with
        (e.g. one mixture per group): built once per evaluation call for every client
        passing an equal `key`, so that its clients are scored together. The key
        must determine the array (include the inputs' identities and settings)."""

    def per_sample_losses(self, params: ModelParams, data: TensorPair | None = None, head: np.ndarray | None = None) -> np.ndarray:
        """Cross-entropy of every sample (eval mode, no grad)."""

    def probabilities(self, params: ModelParams, data: TensorPair | None = None, head: np.ndarray | None = None) -> torch.Tensor:
        """Softmax outputs (eval mode) on the test set or `data`."""
