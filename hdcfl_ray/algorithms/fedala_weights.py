"""Adaptive Local Aggregation (FedALA, spec §3): the blend of a client's old local
model with the downloaded global model, and the learning of its blend weights.

The maths (`blend`, `weight_step`, `start_phase_finished`, the choice of the top-p
tensors) is plain functions. `blend` and `weight_step` use only arithmetic and
`.clip`, so they take numpy arrays (in tests) and torch tensors (in the loop)
alike. `adaptive_local_init` runs steps 1-7 on a client's model through its
`ClientContext`; it imports torch inside, so the server, which imports this
module through `fedala`, never loads torch.

BatchNorm during ALA: the forward passes run in train mode (batch statistics, as
the reference's temporary model copy does), and every buffer of the real model is
restored afterwards, so ALA leaves the running statistics untouched. The returned
initialisation carries the global model's statistics (§0: they are averaged).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import numpy as np

from hdcfl_ray.contract import ClientContext, ModelParams


class ALASettings(Protocol):
    """The FedALA settings the blend reads (fedala.FedALAParams)."""

    layers: int
    data_fraction: float
    eta: float
    start_max_epochs: int
    start_patience: int
    start_tolerance: float


# numpy_rng stream of the s-fraction subset; evaluation-time ALA draws from another
# stream than training-time ALA of the same round.
TRAINING_SUBSET_STREAM = 0xA1A0
EVALUATION_SUBSET_STREAM = 0xA1A1


@dataclass(frozen=True)
class TensorSlot:
    """Where one parameter tensor lives: `part` is "encoder" or "head", then its
    name and slice in that part's flat vector."""

    part: str
    name: str
    shape: tuple[int, ...]
    offset: int
    size: int

    def read(self, params: ModelParams) -> np.ndarray:
        vector = params.encoder if self.part == "encoder" else params.head
        assert vector is not None
        # a copy: the source may be a read-only object-store buffer or a client's committed state
        return np.array(vector[self.offset : self.offset + self.size], dtype=np.float32, copy=True).reshape(self.shape)


@dataclass(frozen=True)
class ALAOutcome:
    initial: ModelParams  # the model local training starts from
    weights: tuple[np.ndarray, ...]  # W_i after this call, one per top tensor
    start_phase: bool  # False once one ALA pass has run
    epochs: int  # weight-learning epochs run (0: skipped because the client never trained)
    epoch_losses: tuple[float, ...]


def blend(local: Any, global_: Any, weights: Any) -> Any:
    """theta~ = theta_i + (theta_g - theta_i) * W: W = 1 takes the global value, W = 0 keeps the local one."""
    return local + (global_ - local) * weights


def weight_step(weights: Any, gradient: Any, global_: Any, local: Any, eta: float) -> Any:
    """W <- clamp(W - eta * g * (theta_g - theta_i), 0, 1), g the loss gradient at theta~."""
    return (weights - eta * gradient * (global_ - local)).clip(0.0, 1.0)


def start_phase_finished(epoch_losses: Sequence[float], max_epochs: int, patience: int, tolerance: float) -> bool:
    """The start phase stops after `max_epochs` epochs, or after `patience` epochs in a
    row that did not improve. An epoch improves when its loss is below the best loss
    so far by more than `tolerance`; only improving epochs set a new best, so slow
    drift below the tolerance cannot keep the phase alive."""
    if len(epoch_losses) >= max_epochs:
        return True
    if not epoch_losses:
        return False
    best = epoch_losses[0]
    epochs_without_improvement = 0
    for loss in epoch_losses[1:]:
        if loss < best - tolerance:
            best = loss
            epochs_without_improvement = 0
        else:
            epochs_without_improvement += 1
    return epochs_without_improvement >= patience


def parameter_slots(
    encoder_parameter_names: Sequence[str], head_parameter_names: Sequence[str], encoder_index: Any, head_index: Any
) -> tuple[TensorSlot, ...]:
    """Every parameter tensor in model order (encoder, then head), located in the flat
    vectors. The flat index also holds BatchNorm buffers; those are not parameters
    and get no slot, so p counts parameter tensors only."""
    slots: list[TensorSlot] = []
    for part, names, index in (("encoder", encoder_parameter_names, encoder_index), ("head", head_parameter_names, head_index)):
        entries = {entry.name: entry for entry in index.entries}
        for name in names:
            if name not in entries:
                raise ValueError(f"parameter {part}.{name} is not in the {part}'s flat index")
            entry = entries[name]
            slots.append(TensorSlot(part=part, name=name, shape=entry.shape, offset=entry.offset, size=entry.size))
    return tuple(slots)


def top_slots(slots: Sequence[TensorSlot], layers: int) -> tuple[TensorSlot, ...]:
    """The last `layers` parameter tensors: the ones ALA blends (H in spec §3)."""
    if layers > len(slots):
        raise ValueError(
            f"algorithm.fedala.layers: {layers} is more than the model's {len(slots)} parameter tensors "
            f"(choose 1..{len(slots)})"
        )
    return tuple(slots[len(slots) - layers :])


def never_trained(local: ModelParams | None, global_: ModelParams, first: TensorSlot) -> bool:
    """Step 1: no local model yet, or it equals the global one on the first tensor."""
    return local is None or bool(np.array_equal(first.read(local), first.read(global_)))


def with_slots(base: ModelParams, slots: Sequence[TensorSlot], values: Sequence[np.ndarray]) -> ModelParams:
    """A copy of `base` with the given tensors replaced."""
    encoder = np.array(base.encoder, dtype=np.float32, copy=True)
    head = None if base.head is None else np.array(base.head, dtype=np.float32, copy=True)
    for slot, value in zip(slots, values, strict=True):
        target = encoder if slot.part == "encoder" else head
        assert target is not None
        target[slot.offset : slot.offset + slot.size] = np.asarray(value, dtype=np.float32).reshape(-1)
    return ModelParams(encoder=encoder, head=head)


def initial_weights(slots: Sequence[TensorSlot]) -> tuple[np.ndarray, ...]:
    return tuple(np.ones(slot.shape, dtype=np.float32) for slot in slots)


def model_slots(ctx: ClientContext) -> tuple[TensorSlot, ...]:
    return parameter_slots(
        [name for name, _ in ctx.model.encoder.named_parameters()],
        [name for name, _ in ctx.model.head.named_parameters()],
        ctx.encoder_index,
        ctx.head_index,
    )


def adaptive_local_init(
    ctx: ClientContext,
    global_params: ModelParams,
    local_params: ModelParams | None,
    weights: tuple[np.ndarray, ...] | None,
    start_phase: bool,
    params: ALASettings,
    subset_stream: int,
) -> ALAOutcome:
    """Steps 1-7 of spec §3 for one client. Reads and returns values only: the caller
    decides whether the new weights and phase are kept, and loads `initial` itself
    (ctx.model's weights are scratch space here)."""
    slots = model_slots(ctx)
    top = top_slots(slots, params.layers)
    current = weights if weights is not None else initial_weights(top)
    if never_trained(local_params, global_params, slots[0]):
        return ALAOutcome(initial=global_params, weights=current, start_phase=start_phase, epochs=0, epoch_losses=())
    assert local_params is not None
    ctx.load(global_params)  # step 2: every tensor below H takes the global value
    learned, losses = _learn_weights(ctx, top, global_params, local_params, current, start_phase, params, subset_stream)
    blended = [blend(slot.read(local_params), slot.read(global_params), w) for slot, w in zip(top, learned)]
    return ALAOutcome(
        initial=with_slots(global_params, top, blended),
        weights=learned,
        start_phase=False,
        epochs=len(losses),
        epoch_losses=tuple(losses),
    )


def _learn_weights(
    ctx: ClientContext,
    top: Sequence[TensorSlot],
    global_params: ModelParams,
    local_params: ModelParams,
    weights: tuple[np.ndarray, ...],
    start_phase: bool,
    params: ALASettings,
    subset_stream: int,
) -> tuple[tuple[np.ndarray, ...], list[float]]:
    """Steps 3-6: gradient descent on W over a fresh random s-fraction of the training data."""
    import torch
    from torch import nn

    modules = {"encoder": ctx.model.encoder, "head": ctx.model.head}
    named = {part: dict(module.named_parameters()) for part, module in modules.items()}
    targets = [named[slot.part][slot.name] for slot in top]
    device = targets[0].device
    global_top = [torch.as_tensor(slot.read(global_params), device=device) for slot in top]
    local_top = [torch.as_tensor(slot.read(local_params), device=device) for slot in top]
    # copies: the caller's arrays (the client's committed state) are never written through
    blend_weights = [torch.tensor(np.array(w, dtype=np.float32), device=device) for w in weights]

    inputs, labels = ctx.train_data()
    num_samples = int(labels.shape[0])
    if num_samples == 0:
        return tuple(np.array(w, dtype=np.float32) for w in weights), []
    subset_size = max(1, int(params.data_fraction * num_samples))
    subset = ctx.numpy_rng(subset_stream).permutation(num_samples)[:subset_size]
    subset_index = torch.as_tensor(subset, dtype=torch.long, device=inputs.device)
    batch_size = ctx.protocol.batch_size

    saved_buffers = {part: {k: v.detach().clone() for k, v in m.named_buffers()} for part, m in modules.items()}
    all_parameters = [p for module in modules.values() for p in module.parameters()]
    trainable = {id(target) for target in targets}
    losses: list[float] = []
    try:
        for parameter in all_parameters:  # lower layers frozen: only theta~ needs a gradient
            parameter.requires_grad_(id(parameter) in trainable)
        for module in modules.values():
            module.train()
        while True:
            loss_sum = torch.zeros((), device=device)
            for start in range(0, subset_size, batch_size):
                batch = subset_index[start : start + batch_size]
                with torch.no_grad():
                    for target, local, global_, w in zip(targets, local_top, global_top, blend_weights):
                        target.copy_(blend(local, global_, w))
                        target.grad = None
                logits = ctx.model.head(ctx.model.encoder(inputs[batch]))
                loss = nn.functional.cross_entropy(logits, labels[batch])
                loss.backward()
                with torch.no_grad():
                    for index, (target, local, global_) in enumerate(zip(targets, local_top, global_top)):
                        blend_weights[index] = weight_step(blend_weights[index], target.grad, global_, local, params.eta)
                loss_sum += loss.detach() * int(batch.shape[0])
            losses.append(float(loss_sum) / subset_size)
            # weight learning is training work too: it shows in the run's budget
            ctx.count_training(subset_size, -(-subset_size // batch_size))
            if not start_phase:
                break  # after the start phase: exactly one epoch
            if start_phase_finished(losses, params.start_max_epochs, params.start_patience, params.start_tolerance):
                break
    finally:
        with torch.no_grad():
            for part, module in modules.items():
                for key, buffer in module.named_buffers():
                    buffer.copy_(saved_buffers[part][key])
        for parameter in all_parameters:
            parameter.requires_grad_(True)
            parameter.grad = None
    return tuple(w.detach().cpu().numpy().astype(np.float32) for w in blend_weights), losses
