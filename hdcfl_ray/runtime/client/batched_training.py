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
sample, plus a `ProximalPull`) with SGD (momentum, weight decay) in float32 or
bfloat16 autocast. Anything else (Adam, float16 loss scaling, another regulariser)
trains one client at a time (`batchable` says which).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from hdcfl_ray.contract import OptimizerConfig, ProximalPull, TrainStats
from hdcfl_ray.models import SplitModel
from hdcfl_ray.runtime.client.local_training import MomentumSGD, train_locally
from hdcfl_ray.runtime.client.precision import active_half_precision, outside_autocast


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
    # any loss term; batched training takes only a ProximalPull (`batchable`)
    regulariser: Callable[..., Any] | None = None
    sample_weights: torch.Tensor | None = None

    @property
    def proximal(self) -> ProximalPull | None:
        return self.regulariser if isinstance(self.regulariser, ProximalPull) else None


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
    )


def batchable(optimizer_config: OptimizerConfig, regulariser: Callable[..., Any] | None) -> bool:
    """Whether a `train` call can run batched with others (else it runs alone)."""
    if optimizer_config.name != "sgd" or active_half_precision() == torch.float16:
        return False
    return regulariser is None or isinstance(regulariser, ProximalPull)


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
        request.sample_weights is None,
        tuple(request.inputs.shape[1:]),
        request.inputs.dtype,
        request.inputs.device,
    )


def train_together(requests: list[TrainRequest]) -> list[TrainStats]:
    """Train every request (each its own client) and return each one's stats, in order.

    Requests that cannot share a batched model with the others (another schedule,
    architecture or setting) form groups of their own; a group of one trains exactly
    as `train_locally` does."""
    stats: list[TrainStats | None] = [None] * len(requests)
    groups: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for position, request in enumerate(requests):
        groups[_group_key(request)].append(position)
    for positions in groups.values():
        if len(positions) == 1:
            stats[positions[0]] = train_alone(requests[positions[0]])
            continue
        for position, result in zip(positions, _train_group([requests[p] for p in positions])):
            stats[position] = result
    return [result for result in stats if result is not None]


class _ClientSchedule:
    """One client's steps: epochs of ceil(n / batch) batches in its own seeded order."""

    def __init__(self, request: TrainRequest) -> None:
        self.request = request
        self.num_samples = int(request.inputs.shape[0])
        self.steps_per_epoch = -(-self.num_samples // request.batch_size)
        self.total_steps = request.epochs * self.steps_per_epoch  # 0 for a client without samples
        self.order: torch.Tensor | None = None
        self.stopped = False  # a non-finite loss ended its training at an epoch's end
        self.steps = 0
        self.seen = 0

    def batch(self, step: int) -> torch.Tensor | None:
        """The sample indices of this client's step `step` (None once it is done)."""
        if self.stopped or step >= self.total_steps:
            return None
        within = step % self.steps_per_epoch
        if within == 0:  # a new epoch draws its order, as train_locally does at the epoch's start
            self.order = torch.randperm(self.num_samples, generator=self.request.generator).to(self.request.inputs.device)
        assert self.order is not None
        start = within * self.request.batch_size
        return self.order[start : start + self.request.batch_size]

    def ends_epoch(self, step: int) -> bool:
        return step % self.steps_per_epoch == self.steps_per_epoch - 1


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
    with torch.no_grad():
        stacked_params, buffers = stack_module_state(joined)  # type: ignore[arg-type]
        params = {name: tensor.detach() for name, tensor in stacked_params.items()}
    targets = None
    if first.proximal is not None:
        targets = [torch.stack([request.proximal.targets[i] for request in requests]) for i in range(len(names))]  # type: ignore[union-attr]
    config = first.optimizer_config
    # every client's SGD momentum (rows of the stacked parameters)
    momentum = {name: torch.zeros_like(params[name]) for name in trainable}
    schedules = [_ClientSchedule(request) for request in requests]
    loss_sums = torch.zeros(len(requests), dtype=torch.float64, device=device)
    finite = torch.ones(len(requests), dtype=torch.bool, device=device)
    was_training = skeleton.training
    skeleton.train()
    for step in range(max(schedule.total_steps for schedule in schedules)):
        batches = [schedule.batch(step) for schedule in schedules]
        by_size: dict[int, list[int]] = defaultdict(list)
        for client, batch in enumerate(batches):
            if batch is not None:
                by_size[int(batch.shape[0])].append(client)
        for size in sorted(by_size, reverse=True):
            clients = by_size[size]
            index = torch.as_tensor(clients, device=device)
            rows = None if len(clients) == len(requests) else index
            losses = _step(skeleton, names, trainable, params, buffers, momentum, targets, requests, batches, clients, rows, config, first.proximal, step == 0)
            finite[index] &= torch.isfinite(losses)
            loss_sums[index] += losses.double() * size
            for client in clients:
                schedules[client].steps += 1
                schedules[client].seen += size
        ending = [client for client, batch in enumerate(batches) if batch is not None and schedules[client].ends_epoch(step)]
        if ending:  # the loss is read once per epoch per client, as train_locally reads it
            flags = finite[torch.as_tensor(ending, device=device)].tolist()
            for client, ok in zip(ending, flags):
                if not ok:
                    schedules[client].stopped = True
    skeleton.train(was_training)
    with torch.no_grad():
        for row, m in enumerate(joined):
            for name, parameter in m.named_parameters():
                parameter.copy_(params[name][row])
            for name, buffer in m.named_buffers():
                buffer.copy_(buffers[name][row])
    totals = loss_sums.tolist()
    results = []
    for schedule, total in zip(schedules, totals):
        nonfinite = schedule.stopped
        mean_loss = float("nan") if nonfinite or not schedule.seen else total / schedule.seen
        results.append(
            TrainStats(mean_loss=mean_loss, num_samples=schedule.num_samples, steps=schedule.steps, nonfinite=nonfinite, samples_processed=schedule.seen)
        )
    return results


def _step(
    skeleton: _Joined,
    names: list[str],
    trainable: list[str],
    params: dict[str, torch.Tensor],
    buffers: dict[str, torch.Tensor],
    momentum: dict[str, torch.Tensor],
    targets: list[torch.Tensor] | None,
    requests: list[TrainRequest],
    batches: list[torch.Tensor | None],
    clients: list[int],
    rows: torch.Tensor | None,
    config: OptimizerConfig,
    proximal: ProximalPull | None,
    first_step: bool,
) -> torch.Tensor:
    """One SGD step of `clients` (`rows` of the stacked tensors, None for all of them),
    each on its own batch of one size; returns their losses (the batch mean plus the
    proximal term)."""
    device = requests[0].inputs.device

    def take(tensor: torch.Tensor) -> torch.Tensor:
        return tensor if rows is None else tensor[rows]

    inputs = torch.stack([requests[c].inputs[batches[c]] for c in clients])  # type: ignore[index]
    labels = torch.stack([requests[c].labels[batches[c]] for c in clients])  # type: ignore[index]
    weights = None
    if requests[0].sample_weights is not None:
        weights = torch.stack([requests[c].sample_weights[batches[c]] for c in clients])  # type: ignore[index]
    live = {name: take(params[name]).detach().requires_grad_(name in trainable) for name in names}
    live_buffers = {name: take(buffer).clone() if rows is not None else buffer for name, buffer in buffers.items()}
    live_targets = None if targets is None else [take(target) for target in targets]

    def client_loss(p: dict[str, torch.Tensor], b: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, *extra: Any) -> torch.Tensor:
        logits = functional_call(skeleton, (p, b), (x,))
        rest = list(extra)
        if weights is None:
            loss = nn.functional.cross_entropy(logits, y)
        else:
            per_sample = nn.functional.cross_entropy(logits, y, reduction="none")
            loss = (per_sample * rest.pop(0)).mean()
        if proximal is not None:
            loss = loss + proximal.penalty([p[name] for name in names], rest.pop(0))
        return loss

    extra: list[Any] = []
    if weights is not None:
        extra.append(weights)
    if live_targets is not None:
        extra.append(live_targets)
    losses = vmap(client_loss, randomness="error")(live, live_buffers, inputs, labels, *extra)
    with outside_autocast(device):
        grads = torch.autograd.grad(losses.sum(), [live[name] for name in trainable], allow_unused=True)
    with torch.no_grad():
        _sgd_step([live[name] for name in trainable], list(grads), trainable, momentum, rows, config, first_step)
        for name in trainable:
            if rows is None:
                params[name] = live[name].detach()
            else:
                params[name][rows] = live[name].detach()
        if rows is not None:
            for name, buffer in live_buffers.items():
                buffers[name][rows] = buffer
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
