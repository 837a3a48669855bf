"""Several clients' local training run as one batched model (`runtime.batched_training`).

Each client keeps its own weights, SGD momentum, BatchNorm statistics, batch order
and schedule; their weights are stacked along a new leading dimension and one
`torch.func.vmap` over `functional_call` runs every client's forward and backward
pass at once, so N clients' convolutions become one grouped kernel instead of N
small ones. A step of SGD is elementwise, so it runs on the stacked tensors with
the operations `MomentumSGD` runs per client, in the same order.

Clients whose schedules differ (other sample counts, so other batch sizes at the
end of an epoch, or fewer steps) are handled step by step: at each step the
clients with a batch of the same size run together, the others wait. The
arithmetic of one client then differs from training it alone only in how the
grouped kernels round (tests/test_batched_training.py states the tolerance), and
it depends on which clients train together: a run is reproducible for the same
scenario, seed and host layout.

What trains here: `train_locally`'s loop (cross-entropy, optionally weighted per
sample, plus a `BatchableRegulariser`: a `ProximalPull` or a `LinearTerm`) with SGD
(momentum, weight decay) in float32 or bfloat16 autocast, each client's batches
augmented by its own draws (dataset.augmentation: the same draws, so the same
augmented bits, as training it alone). Anything else (Adam, float16 loss scaling, another regulariser)
trains one client at a time (`batchable` says which).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any, Callable

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from hdcfl_ray.config.augmentation import AugmentationConfig
from hdcfl_ray.contract import BatchableRegulariser, OptimizerConfig, TrainStats
from hdcfl_ray.data.augmentation import DRAW_COLUMNS, TrainingAugmentation, augment
from hdcfl_ray.models import SplitModel
from hdcfl_ray.runtime.client import replica_weights
from hdcfl_ray.runtime.client.replica_weights import ReplicaWeights
from hdcfl_ray.training.local_training import MomentumSGD, train_locally
from hdcfl_ray.training.precision import active_half_precision, outside_autocast


@dataclass
class TrainRequest:
    """One client's `train` call, as `train_locally` would run it."""

    model: SplitModel
    inputs: torch.Tensor
    labels: torch.Tensor
    epochs: int
    batch_size: int
    optimizer_config: OptimizerConfig
    generator: torch.Generator
    train_head: bool = True
    train_encoder: bool = True
    # any loss term; batched training takes only a BatchableRegulariser (`batchable`)
    regulariser: Callable[..., Any] | None = None
    sample_weights: torch.Tensor | None = None
    # in a host's batched round: where the model's weights are when it does not hold
    # them yet (staged by `ctx.load`), and who keeps the host copy of the trained ones
    weights: ReplicaWeights | None = None
    # the client's crops and flips for its round (dataset.augmentation); None = none
    augmentation: TrainingAugmentation | None = None

    @property
    def batched_term(self) -> BatchableRegulariser | None:
        """The regulariser as data batched training reads (a ProximalPull or a LinearTerm)."""
        return self.regulariser if isinstance(self.regulariser, BatchableRegulariser) else None


def train_alone(request: TrainRequest) -> TrainStats:
    """One request trained by itself: exactly `train_locally`."""
    return train_locally(
        request.model,
        request.inputs,
        request.labels,
        epochs=request.epochs,
        batch_size=request.batch_size,
        optimizer_config=request.optimizer_config,
        generator=request.generator,
        train_head=request.train_head,
        train_encoder=request.train_encoder,
        regulariser=request.regulariser,
        sample_weights=request.sample_weights,
        augmentation=request.augmentation,
    )


def batchable(optimizer_config: OptimizerConfig, regulariser: Callable[..., Any] | None) -> bool:
    """Whether a `train` call can run batched with others (else it runs alone)."""
    if optimizer_config.name != "sgd" or active_half_precision() == torch.float16:
        return False
    return regulariser is None or isinstance(regulariser, BatchableRegulariser)


class _Joined(nn.Module):
    """Encoder and head as one module, so one functional call runs both."""

    def __init__(self, encoder: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = head

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(images))


def _group_key(request: TrainRequest) -> tuple[Any, ...]:
    """Requests with equal keys train together."""
    shapes = tuple((name, tuple(p.shape)) for name, p in _Joined(request.model.encoder, request.model.head).named_parameters())
    return (
        type(request.model.encoder),
        shapes,
        request.epochs,
        request.batch_size,
        request.optimizer_config.model_dump_json(),
        request.train_head,
        request.train_encoder,
        request.regulariser is None,
        type(request.regulariser),  # one penalty is vmapped over a group: one kind of regulariser
        request.sample_weights is None,
        tuple(request.inputs.shape[1:]),
        request.inputs.dtype,
        request.inputs.device,
        None if request.augmentation is None else request.augmentation.settings.model_dump_json(),
    )


def train_together(requests: list[TrainRequest]) -> list[TrainStats]:
    """Train every request (each its own client) and return each one's stats, in order.

    Requests that cannot share a batched model with the others (another schedule,
    architecture or setting) form groups of their own; a group of one trains exactly
    as `train_locally` does. Each one's `trained_together` is the size of its group."""
    stats: list[TrainStats | None] = [None] * len(requests)
    groups: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for position, request in enumerate(requests):
        groups[_group_key(request)].append(position)
    for positions in groups.values():
        if len(positions) == 1:
            alone = requests[positions[0]]
            if alone.weights is not None:
                alone.weights.materialise()
            stats[positions[0]] = train_alone(alone)
            if alone.weights is not None:
                alone.weights.written()
            continue
        for position, result in zip(positions, _train_group([requests[p] for p in positions])):
            stats[position] = replace(result, trained_together=len(positions))
    return [result for result in stats if result is not None]


@dataclass
class _StepGroup:
    """Clients that take a step together: each has a batch of `size` samples at this step."""

    step: int
    size: int
    clients: list[int]
    all_clients: bool  # every client of the group: no row selection needed
    # slices of the plan's one device tensor: the clients' rows, and their batches as
    # indices into the concatenated inputs ([clients, size])
    rows: torch.Tensor | None = None
    batches: torch.Tensor | None = None
    # with augmentation: each sample's draws, in the batches' order ([clients * size, 3])
    draws: torch.Tensor | None = None
    log_offset: int = 0  # where its losses go in the loss log


class _GroupPlan:
    """Every step of a group's training, worked out on the CPU before the first step:
    each client's batch orders for all its epochs (drawn from its own generator, as
    `train_locally` draws them, one per epoch) and its augmentation draws (from its own
    augmentation generator, one draw per epoch after the epoch's order, as there), the
    clients that step together, and their index tensors, all moved to the device in one
    transfer. The step loop then never waits for the device: it slices this plan and
    writes each step's losses into a log read once, when the update ends."""

    def __init__(self, requests: list[TrainRequest]) -> None:
        device = requests[0].inputs.device
        batch = requests[0].batch_size
        epochs = requests[0].epochs
        self.num_samples = [int(request.inputs.shape[0]) for request in requests]
        self.steps_per_epoch = [-(-n // batch) for n in self.num_samples]
        self.offsets = [0]
        for n in self.num_samples[:-1]:
            self.offsets.append(self.offsets[-1] + n)
        # the generators' states after each epoch's draw: a client whose loss turns
        # non-finite stops after that epoch in train_locally, drawing no further orders
        self.generator_states: list[list[torch.Tensor]] = []
        self.augmentation_states: list[list[torch.Tensor]] = []
        orders: list[list[torch.Tensor]] = []
        augmentation_draws: list[list[torch.Tensor]] = []
        for request, n, offset in zip(requests, self.num_samples, self.offsets):
            drawn, states, augmented, augmentation_states = [], [], [], []
            for _ in range(epochs if n else 0):
                drawn.append(torch.randperm(n, generator=request.generator) + offset)
                states.append(request.generator.get_state())
                if request.augmentation is not None:
                    augmented.append(request.augmentation.draw(n))
                    augmentation_states.append(request.augmentation.generator.get_state())
            orders.append(drawn)
            augmentation_draws.append(augmented)
            self.generator_states.append(states)
            self.augmentation_states.append(augmentation_states)
        augmenting = requests[0].augmentation is not None
        pieces: list[torch.Tensor] = []
        self.groups: list[_StepGroup] = []
        total = max(epochs * spe for spe in self.steps_per_epoch)
        log_length = 0
        for step in range(total):
            by_size: dict[int, list[int]] = defaultdict(list)
            for client, (n, spe) in enumerate(zip(self.num_samples, self.steps_per_epoch)):
                if n and step < epochs * spe:
                    within = step % spe
                    by_size[min(batch, n - within * batch)].append(client)
            for size in sorted(by_size, reverse=True):
                clients = by_size[size]
                group = _StepGroup(step, size, clients, len(clients) == len(requests), log_offset=log_length)
                log_length += len(clients)
                for client in clients:
                    within = step % self.steps_per_epoch[client]
                    pieces.append(orders[client][step // self.steps_per_epoch[client]][within * batch : within * batch + size])
                pieces.append(torch.as_tensor(clients, dtype=torch.int64))
                if augmenting:
                    for client in clients:
                        within = step % self.steps_per_epoch[client]
                        epoch_draws = augmentation_draws[client][step // self.steps_per_epoch[client]]
                        pieces.append(epoch_draws[within * batch : within * batch + size].flatten())
                self.groups.append(group)
        self.log_length = log_length
        flat = torch.cat(pieces).to(device) if pieces else torch.zeros(0, dtype=torch.int64, device=device)  # the one transfer
        position = 0
        for group in self.groups:
            count = len(group.clients)
            group.batches = flat[position : position + count * group.size].view(count, group.size)
            position += count * group.size
            group.rows = flat[position : position + count]
            position += count
            if augmenting:
                group.draws = flat[position : position + count * group.size * DRAW_COLUMNS].view(count * group.size, DRAW_COLUMNS)
                position += count * group.size * DRAW_COLUMNS

    def finish(self, requests: list[TrainRequest], loss_log: torch.Tensor) -> list[TrainStats]:
        """Each client's stats from the loss log (one read: the update's only wait for
        the device), as `train_locally` would report them: a client whose loss turned
        non-finite stopped after that epoch, its generator as it left it there."""
        losses = loss_log.tolist()
        epochs = requests[0].epochs
        per_client: list[list[tuple[int, int, float]]] = [[] for _ in requests]  # (step, size, loss)
        for group in self.groups:
            for position, client in enumerate(group.clients):
                per_client[client].append((group.step, group.size, losses[group.log_offset + position]))
        results = []
        for client, request in enumerate(requests):
            spe = self.steps_per_epoch[client]
            loss_sum, seen, steps, nonfinite = 0.0, 0, 0, False
            finite_so_far = True
            for step, size, loss in per_client[client]:
                finite_so_far = finite_so_far and math.isfinite(loss)
                loss_sum += loss * size
                seen += size
                steps += 1
                if step % spe == spe - 1 and not finite_so_far:  # train_locally reads the loss at the epoch's end
                    nonfinite = True
                    epoch = step // spe
                    if epoch + 1 < epochs:
                        request.generator.set_state(self.generator_states[client][epoch])
                        if request.augmentation is not None:
                            request.augmentation.generator.set_state(self.augmentation_states[client][epoch])
                    break
            mean_loss = float("nan") if nonfinite or not seen else loss_sum / seen
            results.append(
                TrainStats(mean_loss=mean_loss, num_samples=self.num_samples[client], steps=steps, nonfinite=nonfinite, samples_processed=seen)
            )
        return results


def _train_group(requests: list[TrainRequest]) -> list[TrainStats]:
    first = requests[0]
    device = first.inputs.device
    skeleton = _Joined(first.model.encoder, first.model.head)
    joined = [_Joined(request.model.encoder, request.model.head) for request in requests]
    names = [name for name, _ in skeleton.named_parameters()]
    trainable = [
        name for name in names if (first.train_encoder if name.startswith("encoder.") else first.train_head)
    ]
    if not trainable:
        raise ValueError("nothing to train: both encoder and head are frozen")
    plan = _GroupPlan(requests)
    weights = [request.weights for request in requests]
    staging = _common_staging(weights)
    with torch.no_grad():
        if staging is not None:  # every client's weights in one buffer: one transfer, no per-client copies
            rows = [w.row for w in weights]  # type: ignore[union-attr]
            params, buffers = replica_weights.stacked_weights_to_device(staging, rows, [r.model for r in requests], device)
        else:
            for w in weights:
                if w is not None:
                    w.materialise()
            stacked_params, buffers = stack_module_state(joined)  # type: ignore[arg-type]
            params = {name: tensor.detach() for name, tensor in stacked_params.items()}
        data = _Concatenated(requests)
    targets = None
    if first.batched_term is not None:
        targets = [torch.stack([request.batched_term.targets[i] for request in requests]) for i in range(len(names))]  # type: ignore[union-attr]
    # every client's SGD momentum (rows of the stacked parameters)
    momentum = {name: torch.zeros_like(params[name]) for name in trainable}
    loss_log = torch.empty(plan.log_length, dtype=torch.float32, device=device)
    was_training = skeleton.training
    skeleton.train()
    state = _StackedState(skeleton, names, trainable, params, buffers, momentum, targets, first.optimizer_config, first.batched_term)
    run_steps(plan.groups, state, data, loss_log)
    skeleton.train(was_training)
    with torch.no_grad():  # each client's rows back into its model: one unbind per tensor, one copy for all
        rows_of = {name: state.params[name].unbind(0) for name in names}
        rows_of.update({name: buffer.unbind(0) for name, buffer in state.buffers.items()})
        targets_back, sources = [], []
        for row, m in enumerate(joined):
            for name, tensor in (*m.named_parameters(), *m.named_buffers()):
                targets_back.append(tensor)
                sources.append(rows_of[name][row])
        torch._foreach_copy_(targets_back, sources)
        trained = None
        wanted = all(w is not None for w in weights) and any(w.snapshots_from_host_copy for w in weights)  # type: ignore[union-attr]
        if wanted and device.type in replica_weights.HOST_COPY_DEVICES:
            trained = replica_weights.take_trained_rows(state.params, state.buffers, weights[0].staging, len(requests))  # type: ignore[union-attr]
    for position, w in enumerate(weights):
        if w is not None:
            w.written(trained, position)
    return plan.finish(requests, loss_log)


def _common_staging(weights: list[ReplicaWeights | None]) -> replica_weights.StagingRows | None:
    """The staging buffer every client of a group has its loaded weights in, or None
    (some client's weights are only in its model)."""
    if not weights or any(w is None or not w.staged for w in weights):
        return None
    staging = weights[0].staging  # type: ignore[union-attr]
    return staging if all(w.staging is staging for w in weights) else None  # type: ignore[union-attr]


@dataclass
class _Concatenated:
    """The group's clients' inputs, labels and sample weights, one after another (the
    plan's batch indices point into them): one gather per step, however many clients."""

    inputs: torch.Tensor
    labels: torch.Tensor
    weights: torch.Tensor | None
    augmentation: AugmentationConfig | None  # the group's crops and flips (the draws are the plan's)

    def __init__(self, requests: list[TrainRequest]) -> None:
        self.inputs = torch.cat([request.inputs for request in requests])
        self.labels = torch.cat([request.labels for request in requests])
        first = requests[0].augmentation
        self.augmentation = None if first is None else first.settings
        weighted = requests[0].sample_weights is not None
        self.weights = torch.cat([request.sample_weights for request in requests]) if weighted else None  # type: ignore[misc]


@dataclass
class _StackedState:
    """What the steps update: the stacked weights, buffers and momentum of a group."""

    skeleton: _Joined
    names: list[str]
    trainable: list[str]
    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    momentum: dict[str, torch.Tensor]
    targets: list[torch.Tensor] | None
    config: OptimizerConfig
    batched_term: BatchableRegulariser | None


def run_steps(groups: list[_StepGroup], state: _StackedState, data: _Concatenated, loss_log: torch.Tensor) -> None:
    """The step loop: every step group of the plan, in order. Nothing here reads a
    value back from the device or moves data to it (tests/test_batched_training.py
    counts it), so on a GPU the host queues step after step while the device works."""
    for group in groups:
        losses = _step(state, data, group)
        loss_log[group.log_offset : group.log_offset + len(group.clients)] = losses


def _step(state: _StackedState, data: _Concatenated, group: _StepGroup) -> torch.Tensor:
    """One SGD step of a group's clients (all of them, or the plan's rows), each on its
    own batch of one size; returns their losses (the batch mean plus the regulariser's term)."""
    rows = None if group.all_clients else group.rows
    names, trainable = state.names, state.trainable

    def take(tensor: torch.Tensor) -> torch.Tensor:
        return tensor if rows is None else tensor[rows]

    inputs = data.inputs[group.batches]
    if data.augmentation is not None and group.draws is not None:  # every client's batch in one gather
        inputs = augment(inputs.flatten(0, 1), group.draws, data.augmentation).view(inputs.shape)
    labels = data.labels[group.batches]
    weights = None if data.weights is None else data.weights[group.batches]
    live = {name: take(state.params[name]).detach().requires_grad_(name in trainable) for name in names}
    live_buffers = {name: take(buffer).clone() if rows is not None else buffer for name, buffer in state.buffers.items()}
    live_targets = None if state.targets is None else [take(target) for target in state.targets]
    skeleton, batched_term = state.skeleton, state.batched_term

    def client_loss(p: dict[str, torch.Tensor], b: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, *extra: Any) -> torch.Tensor:
        logits = functional_call(skeleton, (p, b), (x,))
        rest = list(extra)
        if weights is None:
            loss = nn.functional.cross_entropy(logits, y)
        else:
            per_sample = nn.functional.cross_entropy(logits, y, reduction="none")
            loss = (per_sample * rest.pop(0)).mean()
        if batched_term is not None:
            loss = loss + batched_term.penalty([p[name] for name in names], rest.pop(0))
        return loss

    extra: list[Any] = []
    if weights is not None:
        extra.append(weights)
    if live_targets is not None:
        extra.append(live_targets)
    losses = vmap(client_loss, randomness="error")(live, live_buffers, inputs, labels, *extra)
    with outside_autocast(inputs.device):
        grads = torch.autograd.grad(losses.sum(), [live[name] for name in trainable], allow_unused=True)
    with torch.no_grad():
        _sgd_step([live[name] for name in trainable], list(grads), trainable, state.momentum, rows, state.config, group.step == 0)
        for name in trainable:
            if rows is None:
                state.params[name] = live[name].detach()
            else:
                state.params[name][rows] = live[name].detach()
        if rows is not None:
            for name, buffer in live_buffers.items():
                state.buffers[name][rows] = buffer
    return losses.detach().float()


def _sgd_step(
    parameters: list[torch.Tensor],
    grads: list[torch.Tensor | None],
    names: list[str],
    momentum: dict[str, torch.Tensor],
    rows: torch.Tensor | None,
    config: OptimizerConfig,
    first_step: bool,
) -> None:
    """`MomentumSGD`'s own step on the stacked rows (elementwise, so each client's
    numbers are those of its own step). `momentum` holds every client's buffer; every
    client's first step is the schedule's step 0, where a fresh buffer is the gradient."""
    for parameter, grad in zip(parameters, grads):
        parameter.grad = grad
    optimizer = MomentumSGD(parameters, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
    if not first_step:
        optimizer.buffers = [momentum[name] if rows is None else momentum[name][rows] for name in names]
    optimizer.step()
    if config.momentum == 0:
        return
    for name, buffer in zip(names, optimizer.buffers):
        if buffer is None:  # a parameter without a gradient, left alone
            continue
        if rows is None:
            momentum[name] = buffer
        else:
            momentum[name][rows] = buffer
