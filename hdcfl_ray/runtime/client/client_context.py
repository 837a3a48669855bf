"""The client host's implementation of the contract's `ClientContext`: the model
skeleton, the client's data as tensors, the protocol settings and generators
fixed by (seed, client, round): the batch order's and the training-time
augmentation's. Methods train and score through it and never touch Ray."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Hashable

import numpy as np
import torch
from torch import nn

from hdcfl_ray import seeding
from hdcfl_ray.config.augmentation import AugmentationConfig
from hdcfl_ray.config.schema import OptimizerConfig, ProtocolConfig
from hdcfl_ray.contract import BatchableRegulariser, EvalStats, ModelParams, TrainingBudget, TrainStats
from hdcfl_ray.data.augmentation import TrainingAugmentation, training_augmentation
from hdcfl_ray.models import FlatIndex, SplitModel, flatten_module, load_flat_into
from hdcfl_ray.runtime.client.batched_training import TrainRequest, batchable, train_alone
from hdcfl_ray.runtime.client.replica_weights import ReplicaWeights
from hdcfl_ray.training.local_training import check_sample_weights, evaluate

if TYPE_CHECKING:
    from hdcfl_ray.runtime.client.batched_scoring import EvaluationBatch, PendingScore
    from hdcfl_ray.runtime.client.training_rendezvous import TrainingSlot

TensorPair = tuple[torch.Tensor, torch.Tensor]
# extra loss term added to each batch's cross-entropy (e.g. a proximal pull)
Regulariser = Callable[[SplitModel], torch.Tensor]


class _ModelAsMethodsReadIt:
    """`HostClientContext.model` as a method reads it: in a batched round, weights the
    context has only staged are copied in first, and the rest of the method's update
    loads, trains and snapshots through the model itself (replica_weights.py)."""

    def __get__(self, ctx: HostClientContext | None, owner: type | None = None) -> SplitModel:
        if ctx is None:
            raise AttributeError("model")  # a field without a default
        if ctx._replica_weights is not None:
            ctx._replica_weights.expose()
        return ctx._replica

    def __set__(self, ctx: HostClientContext, model: SplitModel) -> None:
        ctx._replica = model


@dataclass
class HostClientContext:
    client_id: int
    round_index: int
    seed: int
    model: SplitModel = _ModelAsMethodsReadIt()  # type: ignore[assignment]
    encoder_index: FlatIndex
    head_index: FlatIndex
    protocol: ProtocolConfig
    # the batch-order generator for this round, or a function that makes it on first use
    # (seeding one costs more than scoring a small client, and evaluation never needs it)
    generator: torch.Generator | Callable[[], torch.Generator]
    _train_data: Callable[[], TensorPair]
    _test_data: Callable[[], TensorPair]
    _raw_train: Callable[[], tuple[np.ndarray, np.ndarray]]
    # the classes of the client's training labels (the host caches them per client)
    _own_classes: Callable[[], torch.Tensor] | None = None
    # set during a host's evaluation call: `score` then defers to it (batched_scoring.py)
    _evaluation_batch: EvaluationBatch | None = None
    # set during a host's batched training round: `train` then trains with the round's other clients
    _training_slot: TrainingSlot | None = None
    # set during a host's batched training round: where the model's weights are (staged or in the model)
    _replica_weights: ReplicaWeights | None = None
    # the scenario's training-time augmentation (dataset.augmentation); its generator is made on first use
    _augmentation_settings: AugmentationConfig = field(default_factory=AugmentationConfig)
    _augmentation: TrainingAugmentation | None = field(default=None, init=False, repr=False, compare=False)
    # the model itself (`model` is how methods read it)
    _replica: SplitModel = field(init=False, repr=False, compare=False)
    # arrays `snapshot` returned from trained weights checked finite on the device
    _finite_arrays: list[np.ndarray] = field(default_factory=list, init=False, repr=False, compare=False)
    # training work done through this context (every `train` call, plus `count_training`)
    _samples_trained: int = field(default=0, init=False)
    _steps_trained: int = field(default=0, init=False)
    # the largest batched group any of its `train` calls ran in (1: each trained alone)
    _trained_together: int = field(default=1, init=False)

    def batch_generator(self) -> torch.Generator:
        """The client's batch-order generator for this round."""
        if not isinstance(self.generator, torch.Generator):
            self.generator = self.generator()
        return self.generator

    def training_augmentation(self) -> TrainingAugmentation | None:
        """The client's crops and flips for this round (one generator for all its training
        this round), or None when the scenario adds none."""
        if self._augmentation is None:
            self._augmentation = training_augmentation(self._augmentation_settings, self.seed, self.client_id, self.round_index)
        return self._augmentation

    # ---- budget ----
    @property
    def budget(self) -> TrainingBudget:
        return TrainingBudget(samples=self._samples_trained, steps=self._steps_trained)

    @property
    def trained_together(self) -> int:
        """The most clients, this one included, that any of this context's `train`
        calls trained with as one batched model (1 when every call trained alone)."""
        return self._trained_together

    def count_training(self, samples: int, steps: int) -> None:
        """Record training a method runs outside `train` (e.g. FedALA's weight learning)."""
        self._samples_trained += int(samples)
        self._steps_trained += int(steps)

    # ---- data ----
    def train_data(self) -> TensorPair:
        return self._train_data()

    def training_batch(self, images: torch.Tensor) -> torch.Tensor:
        """A batch of training images as local training sees it: augmented with the
        client's next draws when the scenario augments, else `images` itself."""
        augmentation = self.training_augmentation()
        return images if augmentation is None else augmentation(images)

    def test_data(self) -> TensorPair:
        return self._test_data()

    def raw_train(self) -> tuple[np.ndarray, np.ndarray]:
        """The client's training images as stored (uint8, after its rotation; no
        normalisation, no augmentation), shape (N, H, W, C), and their labels."""
        return self._raw_train()

    @property
    def num_train(self) -> int:
        return int(self.train_data()[1].shape[0])

    def own_classes(self) -> torch.Tensor:
        """The classes present in the client's training data (sorted), on its device."""
        if self._own_classes is not None:
            return self._own_classes()
        return torch.unique(self.train_data()[1])

    def numpy_rng(self, stream: int = 0) -> np.random.Generator:
        """A numpy generator fixed by (seed, client, round, stream)."""
        return seeding.rng(self.seed, "client", self.client_id, self.round_index, sub=stream)

    # ---- weights ----
    def load(self, params: ModelParams, head: np.ndarray | None = None) -> None:
        """Load an encoder and a head (`head` overrides params.head)."""
        head_vector = head if head is not None else params.head
        weights = self._replica_weights
        if weights is not None:
            if head_vector is not None and weights.load(params.encoder, head_vector):
                return  # staged: the model gets the weights when something reads it
            weights.materialise()
            weights.written()
        load_flat_into(self._replica.encoder, params.encoder, self.encoder_index)
        if head_vector is None:
            raise ValueError("no head given: pass params with a head or head=...")
        load_flat_into(self._replica.head, head_vector, self.head_index)

    def snapshot(self) -> ModelParams:
        taken = self._replica_weights.snapshot() if self._replica_weights is not None else None
        if taken is None:
            model = self._loaded_model()
            return ModelParams(encoder=flatten_module(model.encoder), head=flatten_module(model.head))
        encoder, head, checked_finite = taken
        if checked_finite:
            self._finite_arrays.extend((encoder, head))
        return ModelParams(encoder=encoder, head=head)

    def known_finite(self, array: np.ndarray) -> bool:
        """Whether `array` is one `snapshot` returned from weights checked finite on the
        device (the host need not check it again)."""
        return any(array is checked for checked in self._finite_arrays)

    def _loaded_model(self) -> SplitModel:
        """The model holding the current weights, for the context's own use."""
        if self._replica_weights is not None:
            self._replica_weights.materialise()
        return self._replica

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
        """Train the loaded model with the protocol's optimizer (fresh state) and batch size;
        `sample_weights` weight each sample's loss (see `train_locally`)."""
        inputs, labels = data if data is not None else self.train_data()
        weights = self._replica_weights
        if weights is not None and regulariser is not None and not isinstance(regulariser, BatchableRegulariser):
            weights.expose()  # the regulariser is handed the model
        together = self._training_slot is not None and batchable(optimizer or self.protocol.optimizer, regulariser)
        request = TrainRequest(
            model=self._replica,
            inputs=inputs,
            labels=labels,
            epochs=self.protocol.local_epochs if epochs is None else epochs,
            batch_size=self.protocol.batch_size,
            optimizer_config=optimizer or self.protocol.optimizer,
            generator=self.batch_generator(),
            train_head=train_head,
            train_encoder=train_encoder,
            regulariser=regulariser,
            sample_weights=sample_weights,
            weights=weights if together else None,
            augmentation=self.training_augmentation(),
        )
        if together:
            if not (train_head or train_encoder):
                raise ValueError("nothing to train: both encoder and head are frozen")
            check_sample_weights(sample_weights, inputs)  # train_alone checks in train_locally
            stats = self._training_slot.train(request)  # type: ignore[union-attr]
        else:
            self._loaded_model()
            stats = train_alone(request)
            if weights is not None:
                weights.written()
        self.count_training(stats.samples_processed, stats.steps)
        self._trained_together = max(self._trained_together, stats.trained_together)
        return stats

    def score(
        self, params: ModelParams | None = None, head: np.ndarray | None = None, data: TensorPair | None = None
    ) -> EvalStats | PendingScore:
        """Accuracy and loss on the client's test set (or `data`) of the given (or loaded) model.

        Inside a host's evaluation call, scoring given weights on the test set is
        batched with the host's other clients: the value is a `PendingScore` that
        reads like EvalStats, and the model is left as it was (call `load` to train
        or score the loaded model afterwards)."""
        if params is not None and data is None and self._evaluation_batch is not None:
            head_vector = head if head is not None else params.head
            if head_vector is None:
                raise ValueError("no head given: pass params with a head or head=...")
            inputs, labels = self.test_data()
            pending = self._evaluation_batch.defer(params.encoder, head_vector, inputs, labels, self.own_classes())
            if pending is not None:
                return pending
        if params is not None:
            self.load(params, head)
        inputs, labels = data if data is not None else self.test_data()
        return evaluate(self._loaded_model(), inputs, labels, own_classes=self.own_classes())

    def shared_array(self, key: Hashable, build: Callable[[], np.ndarray]) -> np.ndarray:
        """An encoder derived from broadcast objects that many clients of a host score
        with (e.g. one mixture per group): made once per evaluation call for all
        clients passing the same `key`, and scored together with them. Outside an
        evaluation call it is simply `build()`."""
        if self._evaluation_batch is None:
            return build()
        return self._evaluation_batch.shared_array(key, build)

    @torch.no_grad()
    def per_sample_losses(self, params: ModelParams, data: TensorPair | None = None, head: np.ndarray | None = None) -> np.ndarray:
        """Cross-entropy of every sample (eval mode, no grad): for loss-based cluster assignment."""
        self.load(params, head)
        inputs, labels = data if data is not None else self.train_data()
        if int(inputs.shape[0]) == 0:
            return np.zeros(0, dtype=np.float32)
        return nn.functional.cross_entropy(self._logits(inputs), labels, reduction="none").cpu().numpy()

    @torch.no_grad()
    def probabilities(self, params: ModelParams, data: TensorPair | None = None, head: np.ndarray | None = None) -> torch.Tensor:
        """Softmax outputs (eval mode) on the test set or `data`: for output-space ensembles."""
        self.load(params, head)
        inputs, _ = data if data is not None else self.test_data()
        if int(inputs.shape[0]) == 0:
            return torch.zeros(0, device=inputs.device)
        return torch.softmax(self._logits(inputs), dim=1)

    def _logits(self, inputs: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
        """Logits of the loaded model in eval mode, computed in batches (callers hold no_grad)."""
        model = self._loaded_model()
        model.encoder.eval()
        model.head.eval()
        parts = [model.head(model.encoder(inputs[start : start + batch_size])) for start in range(0, int(inputs.shape[0]), batch_size)]
        return torch.cat(parts).float()  # float32 even under a half-precision autocast
