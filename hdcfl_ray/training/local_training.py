"""Local SGD on one client's data and evaluation on its test set (plain torch, no Ray)."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from hdcfl_ray import seeding
from hdcfl_ray.contract import EvalStats, OptimizerConfig, TrainStats
from hdcfl_ray.data.augmentation import TrainingAugmentation, augment
from hdcfl_ray.models import SplitModel
from hdcfl_ray.training.precision import LossScaler, active_half_precision, outside_autocast
from hdcfl_ray.training.scores import restricted_predictions, stats_from_probabilities  # noqa: F401  (re-exported)
from hdcfl_ray.training.tally import DeviceTally  # noqa: F401  (re-exported: the loop's own tally)


class MomentumSGD:
    """SGD with momentum and weight decay: the update torch.optim.SGD runs, operation
    for operation, over all tensors at once (torch's foreach kernels: one launch per
    operation on CUDA instead of one per tensor). On CPU a foreach operation runs the
    per-tensor kernel on each tensor in turn, so the results are the same bits as
    torch.optim.SGD's single-tensor loop (tested).

    Why not torch.optim.SGD: a client builds a fresh optimizer every round, and the
    first torch optimizer built in a process imports torch._dynamo (about 2 s), which
    is most of a short simulation's first round. This class needs nothing but tensors.
    """

    def __init__(self, parameters: list[nn.Parameter], lr: float, momentum: float, weight_decay: float) -> None:
        self.parameters = list(parameters)
        self.lr = float(lr)
        self.momentum = float(momentum)
        self.weight_decay = float(weight_decay)
        self.buffers: list[torch.Tensor | None] = [None] * len(self.parameters)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for parameter in self.parameters:
            parameter.grad = None

    @torch.no_grad()
    def step(self) -> None:
        positions = [index for index, parameter in enumerate(self.parameters) if parameter.grad is not None]
        if not positions:
            return
        parameters = [self.parameters[index] for index in positions]
        grads = [parameter.grad for parameter in parameters]
        if self.weight_decay != 0:
            grads = torch._foreach_add(grads, parameters, alpha=self.weight_decay)
        if self.momentum != 0:
            kept_buffers, kept_grads = [], []
            for index, grad in zip(positions, grads):
                buffer = self.buffers[index]
                if buffer is None:  # a fresh buffer starts as the gradient
                    self.buffers[index] = grad.detach().clone()
                else:
                    kept_buffers.append(buffer)
                    kept_grads.append(grad)
            if kept_buffers:
                torch._foreach_mul_(kept_buffers, self.momentum)
                torch._foreach_add_(kept_buffers, kept_grads, alpha=1.0)
            grads = [self.buffers[index] for index in positions]
        torch._foreach_add_(parameters, grads, alpha=-self.lr)


def make_optimizer(parameters: list[nn.Parameter], config: OptimizerConfig) -> MomentumSGD | torch.optim.Optimizer:
    if config.name == "sgd":
        return MomentumSGD(parameters, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
    # CUDA: one fused kernel for the whole step; CPU keeps torch's default (other bits than fused)
    fused = True if parameters and parameters[0].device.type == "cuda" else None
    return torch.optim.Adam(parameters, lr=config.lr, weight_decay=config.weight_decay, fused=fused)


def check_sample_weights(sample_weights: torch.Tensor | None, inputs: torch.Tensor) -> None:
    """One weight per training sample, or none (ValueError otherwise)."""
    if sample_weights is not None and int(sample_weights.shape[0]) != int(inputs.shape[0]):
        raise ValueError(f"sample_weights has {int(sample_weights.shape[0])} entries for {int(inputs.shape[0])} samples")


def train_locally(
    model: SplitModel,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    optimizer_config: OptimizerConfig,
    generator: torch.Generator,
    train_head: bool = True,
    train_encoder: bool = True,
    regulariser: Callable[[SplitModel], torch.Tensor] | None = None,
    sample_weights: torch.Tensor | None = None,
    augmentation: TrainingAugmentation | None = None,
) -> TrainStats:
    """Train encoder and head jointly (either may be frozen) for `epochs` passes.

    A frozen part is left out of the optimizer, so weight decay and momentum
    cannot move it either. `regulariser(model)` is added to every batch's loss.
    `sample_weights` (one per input, e.g. EM responsibilities) turn each batch's
    loss into mean_i(w_i * CE_i): the weighted objective sum_i w_i CE_i / N in
    minibatches, so a model that explains little of the data also moves little.
    Without weights the loss is the plain batch mean (the same bits as before).

    `inputs` are already transformed float tensors on the model's device; the
    generator alone decides the batch order, so a client's update does not depend
    on which actor runs it. `augmentation` (dataset.augmentation) crops and flips
    every batch; its draws come from its own generator, one per sample in the order
    the epoch visits them, drawn once per epoch after the epoch's batch order.
    """
    model.encoder.train()
    model.head.train()
    parameters: list[nn.Parameter] = []
    for part, trainable in ((model.encoder, train_encoder), (model.head, train_head)):
        for parameter in part.parameters():
            parameter.requires_grad_(trainable)
            if trainable:
                parameters.append(parameter)
    if not parameters:
        raise ValueError("nothing to train: both encoder and head are frozen")
    optimizer = make_optimizer(parameters, optimizer_config)
    loss_fn = nn.CrossEntropyLoss()
    check_sample_weights(sample_weights, inputs)
    num_samples = int(inputs.shape[0])
    # Under a float16 autocast (runtime.precision) the loss is scaled; bfloat16 needs no scaling.
    scaler = LossScaler() if active_half_precision() == torch.float16 else None
    tally = DeviceTally(inputs.device)
    seen = 0
    steps = 0
    nonfinite = False
    for _ in range(epochs):
        order = torch.randperm(num_samples, generator=generator).to(inputs.device)
        draws = augmentation.draw(num_samples).to(inputs.device) if augmentation is not None else None
        for start in range(0, num_samples, batch_size):
            batch = order[start : start + batch_size]
            optimizer.zero_grad(set_to_none=True)
            batch_inputs = inputs[batch]
            if augmentation is not None and draws is not None:
                batch_inputs = augment(batch_inputs, draws[start : start + batch_size], augmentation.settings)
            logits = model.head(model.encoder(batch_inputs))
            if sample_weights is None:
                loss = loss_fn(logits, labels[batch])
            else:
                per_sample = nn.functional.cross_entropy(logits, labels[batch], reduction="none")
                loss = (per_sample * sample_weights[batch]).mean()
            if regulariser is not None:
                loss = loss + regulariser(model)
            with outside_autocast(inputs.device):
                if scaler is None:
                    loss.backward()
                    optimizer.step()
                else:
                    scaler.backward(loss)
                    if scaler.unscale_and_check(parameters):  # float16 only: one sync per step
                        optimizer.step()
            count = int(batch.shape[0])
            tally.add(loss, count)
            seen += count
            steps += 1
        # The loss is read once per epoch, not per step (no GPU stall inside the epoch).
        # A NaN/Inf loss makes the whole update untrusted: its mean loss is NaN, so the
        # host rejects the upload and the client keeps its committed state.
        if not tally.all_finite():
            nonfinite = True
            break
    for parameter in [*model.encoder.parameters(), *model.head.parameters()]:
        parameter.requires_grad_(True)
    mean_loss = float("nan") if nonfinite or not seen else tally.total() / seen
    return TrainStats(mean_loss=mean_loss, num_samples=num_samples, steps=steps, nonfinite=nonfinite, samples_processed=seen)


@torch.no_grad()
def evaluate(
    model: SplitModel, inputs: torch.Tensor, labels: torch.Tensor, batch_size: int = 512, own_classes: torch.Tensor | None = None
) -> EvalStats:
    """Accuracy and mean cross-entropy; with `own_classes` also the accuracy of the
    prediction restricted to those classes (EvalStats.accuracy_own_classes)."""
    num_samples = int(inputs.shape[0])
    if num_samples == 0:
        return EvalStats(accuracy=float("nan"), loss=float("nan"), num_samples=0)
    model.encoder.eval()
    model.head.eval()
    device = inputs.device
    tally = DeviceTally(device)
    correct = torch.zeros((), dtype=torch.long, device=device)
    correct_own = torch.zeros((), dtype=torch.long, device=device)
    for start in range(0, num_samples, batch_size):
        logits = model.head(model.encoder(inputs[start : start + batch_size])).float()
        target = labels[start : start + batch_size]
        tally.add(nn.functional.cross_entropy(logits, target, reduction="sum"), 1)
        correct += (logits.argmax(dim=1) == target).sum()
        if own_classes is not None:
            correct_own += (restricted_predictions(logits, own_classes) == target).sum()
    # one read at the end instead of two per batch
    own = int(correct_own) / num_samples if own_classes is not None else float("nan")
    return EvalStats(accuracy=int(correct) / num_samples, loss=tally.total() / num_samples, num_samples=num_samples, accuracy_own_classes=own)


def client_generator(seed: int, client_id: int, round_index: int) -> torch.Generator:
    """A generator fixed by (run seed, client, round) alone."""
    generator = torch.Generator()
    generator.manual_seed(seeding.int_seed(seed, "batches", client_id, round_index))
    return generator
