"""The server optimiser: the step from a shared model x to the next one, given the
round's mean of what the clients sent (protocol.server_optimizer; docs/baselines.md,
"Server optimisers").

The pseudo-gradient is delta = mean - x. With t the slot's step count (1 at its first):

    sgd      x += lr delta
    avgm     m = momentum m + delta;                         x += lr m
    adam     m = beta1 m + (1 - beta1) delta;  v = beta2 v + (1 - beta2) delta^2
    yogi     m as adam;                        v = v - (1 - beta2) delta^2 sign(v - delta^2)
    adagrad  m as adam;                        v = v + delta^2
             the three adaptive rules:         x += lr_t m / (sqrt(v) + tau)

m and v start at zero; lr_t = lr, or with `bias_correction` (adam, yogi)
lr sqrt(1 - beta2^t) / (1 - beta1^t). These are Reddi et al., "Adaptive Federated
Optimization" (ICLR 2021), Algorithm 2, and FedAvgM (Hsu et al. 2019).

Each shared model is a slot of its own ("global/encoder", "cluster/3/head"), with its
own moments and step count, kept in the method's server state (`ServerMoments`), so a
checkpoint saves them and a resume continues them exactly. Arithmetic is float64, the
new model float32. The default (sgd at lr 1, or avgm without momentum at lr 1) returns
the mean itself and keeps no state: FedAvg's server bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Sequence, TypeVar

import numpy as np

from hdcfl_ray.contract import ModelParams, ServerOptimizerConfig


@dataclass(frozen=True)
class Moments:
    """The optimiser's state for one slot: its step count and, float64 and shaped like
    the slot's vector, m (avgm's momentum, the adaptive rules' first moment) and v
    (the adaptive rules' second moment), None until a rule needs them."""

    steps: int = 0
    first: np.ndarray | None = None
    second: np.ndarray | None = None


# slot name -> its moments: a field of a method's server state
ServerMoments = dict[str, Moments]


def step_vector(config: ServerOptimizerConfig, moments: Moments, current: np.ndarray, mean: np.ndarray) -> tuple[np.ndarray, Moments]:
    """The next value of one slot (float32) and its moments after the step; nothing is
    written in place. The default rule returns `mean` itself and `moments` unchanged."""
    if config.is_identity:
        return mean, moments
    if np.shape(current) != np.shape(mean):
        raise ValueError(f"the server step needs the mean shaped like the model, got {np.shape(mean)} for {np.shape(current)}")
    return step_by_delta(config, moments, current, np.asarray(mean, dtype=np.float64) - np.asarray(current, dtype=np.float64))


def step_by_delta(config: ServerOptimizerConfig, moments: Moments, current: np.ndarray, delta: np.ndarray) -> tuple[np.ndarray, Moments]:
    """`step_vector` given the pseudo-gradient itself (FedBuff's buffered mean delta), with
    no shortcut for the default rule: x + lr delta, float32."""
    x = np.asarray(current, dtype=np.float64)
    delta = np.asarray(delta, dtype=np.float64)
    steps = moments.steps + 1
    if config.name == "sgd":
        return (x + config.lr * delta).astype(np.float32), Moments(steps=steps)
    if config.name == "avgm":
        first = delta if moments.first is None else config.momentum * moments.first + delta
        return (x + config.lr * first).astype(np.float32), Moments(steps=steps, first=first)
    previous_first = np.zeros_like(x) if moments.first is None else moments.first
    previous_second = np.zeros_like(x) if moments.second is None else moments.second
    first = config.beta1 * previous_first + (1.0 - config.beta1) * delta
    squared = delta * delta
    if config.name == "adam":
        second = config.beta2 * previous_second + (1.0 - config.beta2) * squared
    elif config.name == "yogi":
        second = previous_second - (1.0 - config.beta2) * squared * np.sign(previous_second - squared)
    elif config.name == "adagrad":
        second = previous_second + squared
    else:  # the schema admits no other name
        raise ValueError(f"protocol.server_optimizer.name: {config.name!r} is not a server optimiser")
    rate = config.lr
    if config.bias_correction and config.name in ("adam", "yogi"):
        rate = config.lr * np.sqrt(1.0 - config.beta2**steps) / (1.0 - config.beta1**steps)
    stepped = x + rate * first / (np.sqrt(second) + config.tau)
    return stepped.astype(np.float32), Moments(steps=steps, first=first, second=second)


Shared = TypeVar("Shared", ModelParams, np.ndarray)


def server_step(config: ServerOptimizerConfig, moments: ServerMoments, slot: str, current: Shared, mean: Shared) -> Shared:
    """The next value of the shared model `slot` (a flat vector, or a model whose encoder
    and head are the slots `<slot>/encoder` and `<slot>/head`) given the clients' `mean`;
    `moments` (the method's server state) gets the slots' new moments."""
    if config.is_identity:
        return mean
    if isinstance(current, ModelParams):
        assert isinstance(mean, ModelParams)
        encoder = server_step(config, moments, f"{slot}/encoder", current.encoder, mean.encoder)
        if current.head is None or mean.head is None:
            return ModelParams(encoder=encoder, head=mean.head)
        return ModelParams(encoder=encoder, head=server_step(config, moments, f"{slot}/head", current.head, mean.head))
    stepped, moments[slot] = step_vector(config, moments.get(slot, Moments()), current, mean)
    return stepped


def server_step_clusters(
    config: ServerOptimizerConfig,
    moments: ServerMoments,
    current: Sequence[ModelParams],
    means: Sequence[ModelParams],
    updated: Collection[int],
) -> list[ModelParams]:
    """Every cluster model's next value: cluster j (slot `cluster/<j>`, moments of its own)
    steps towards `means[j]` when it is in `updated` (it received an update this round)
    and stays as it was otherwise. The default rule returns `means` as they are."""
    if config.is_identity:
        return list(means)
    return [
        server_step(config, moments, cluster_slot(j), model, means[j]) if j in updated else model for j, model in enumerate(current)
    ]


def cluster_slot(cluster: int) -> str:
    return f"cluster/{cluster}"

