"""The server optimiser's maths (hdcfl_ray/maths/server_optimizer.py): each rule of Reddi et
al.'s Algorithm 2 and FedAvgM, written out here step by step; one state per slot; the
default returns the clients' mean itself; a cluster without an update takes no step;
FedBuff steps on its buffered delta."""

from __future__ import annotations

import numpy as np
import pytest

from hdcfl_ray.algorithms.async_mixing import fedbuff_optimised_step, fedbuff_step
from hdcfl_ray.contract import ModelParams, ServerOptimizerConfig
from hdcfl_ray.maths.server_optimizer import Moments, server_step, server_step_clusters, step_vector


def rounds_of_means(count: int = 4, size: int = 5, seed: int = 0) -> tuple[np.ndarray, list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    start = rng.normal(size=size).astype(np.float32)
    return start, [(start + rng.normal(scale=0.3, size=size)).astype(np.float32) for _ in range(count)]


def by_hand(config: ServerOptimizerConfig, start: np.ndarray, means: list[np.ndarray]) -> list[np.ndarray]:
    """The rules as the paper writes them, one round after another, in float64 (the model
    stored as float32 between rounds, as the server keeps it)."""
    x = start.astype(np.float32)
    m = np.zeros(start.shape)
    v = np.zeros(start.shape)
    out = []
    for t, mean in enumerate(means, start=1):
        delta = mean.astype(np.float64) - x.astype(np.float64)
        if config.name == "sgd":
            new = x + config.lr * delta
        elif config.name == "avgm":
            m = config.momentum * m + delta
            new = x + config.lr * m
        else:
            m = config.beta1 * m + (1 - config.beta1) * delta
            if config.name == "adam":
                v = config.beta2 * v + (1 - config.beta2) * delta**2
            elif config.name == "yogi":
                v = v - (1 - config.beta2) * delta**2 * np.sign(v - delta**2)
            else:
                v = v + delta**2
            lr = config.lr
            if config.bias_correction and config.name != "adagrad":
                lr = lr * np.sqrt(1 - config.beta2**t) / (1 - config.beta1**t)
            new = x + lr * m / (np.sqrt(v) + config.tau)
        x = new.astype(np.float32)
        out.append(x)
    return out


CONFIGS = [
    ServerOptimizerConfig(name="sgd", lr=0.5),
    ServerOptimizerConfig(name="avgm", lr=1.0, momentum=0.9),
    ServerOptimizerConfig(name="avgm", lr=0.3, momentum=0.5),
    ServerOptimizerConfig(name="adam", lr=0.05, beta1=0.9, beta2=0.99, tau=1e-3),
    ServerOptimizerConfig(name="adam", lr=0.05, tau=1e-3, bias_correction=True),
    ServerOptimizerConfig(name="yogi", lr=0.02, beta1=0.8, beta2=0.9, tau=1e-2),
    ServerOptimizerConfig(name="yogi", lr=0.02, tau=1e-2, bias_correction=True),
    ServerOptimizerConfig(name="adagrad", lr=0.1, beta1=0.0, tau=1e-9),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.name}-bc{int(c.bias_correction)}-lr{c.lr:g}")
def test_each_rule_steps_as_its_update_rule_reads(config: ServerOptimizerConfig) -> None:
    start, means = rounds_of_means()
    x, moments, got = start, Moments(), []
    for mean in means:
        x, moments = step_vector(config, moments, x, mean)
        assert x.dtype == np.float32
        got.append(x)
    assert moments.steps == len(means)
    for ours, expected in zip(got, by_hand(config, start, means)):
        np.testing.assert_allclose(ours, expected, rtol=1e-6, atol=1e-7)


def test_bias_correction_scales_the_first_adam_step_by_the_textbook_factor() -> None:
    start, (mean, *_) = rounds_of_means(count=1)
    plain, _ = step_vector(ServerOptimizerConfig(name="adam", lr=0.1), Moments(), start, mean)
    corrected, _ = step_vector(ServerOptimizerConfig(name="adam", lr=0.1, bias_correction=True), Moments(), start, mean)
    factor = np.sqrt(1 - 0.99) / (1 - 0.9)  # t = 1
    np.testing.assert_allclose(corrected - start, factor * (plain - start), rtol=1e-5)


@pytest.mark.parametrize("config", [ServerOptimizerConfig(), ServerOptimizerConfig(name="avgm", momentum=0.0, lr=1.0)])
def test_the_default_returns_the_mean_itself_and_keeps_no_state(config: ServerOptimizerConfig) -> None:
    assert config.is_identity
    start, (mean, *_) = rounds_of_means(count=1)
    moments: dict[str, Moments] = {}
    model = ModelParams(start, start[:2].copy())
    averaged = ModelParams(mean, mean[:2].copy())
    assert server_step(config, moments, "global", model, averaged) is averaged
    assert moments == {}


def test_lr_below_one_or_momentum_is_not_the_default() -> None:
    assert not ServerOptimizerConfig(lr=0.5).is_identity
    assert not ServerOptimizerConfig(name="avgm", momentum=0.1).is_identity
    assert not ServerOptimizerConfig(name="adam", lr=1.0).is_identity


def test_every_slot_keeps_its_own_moments() -> None:
    config = ServerOptimizerConfig(name="adam", lr=0.05)
    start, means = rounds_of_means(size=7)
    moments: dict[str, Moments] = {}
    model = ModelParams(start[:5], start[5:])
    for mean in means[:2]:
        model = server_step(config, moments, "global", model, ModelParams(mean[:5], mean[5:]))
    assert sorted(moments) == ["global/encoder", "global/head"]
    assert moments["global/encoder"].first.shape == (5,) and moments["global/head"].first.shape == (2,)
    # the encoder alone, stepped by itself, gives the same bits: no state crosses slots
    alone, state = start[:5], Moments()
    for mean in means[:2]:
        alone, state = step_vector(config, state, alone, mean[:5])
    assert np.array_equal(alone, model.encoder)


def test_a_cluster_without_an_update_takes_no_step_and_keeps_its_moments() -> None:
    config = ServerOptimizerConfig(name="avgm", lr=1.0, momentum=0.9)
    start, means = rounds_of_means(count=2)
    clusters = [ModelParams(start), ModelParams(start * 2)]
    moments: dict[str, Moments] = {}
    first = server_step_clusters(config, moments, clusters, [ModelParams(means[0]), ModelParams(means[0] * 2)], updated={0, 1})
    assert sorted(moments) == ["cluster/0/encoder", "cluster/1/encoder"]
    before = moments["cluster/1/encoder"]
    second = server_step_clusters(config, moments, first, [ModelParams(means[1]), first[1]], updated={0})
    assert second[1] is first[1] and moments["cluster/1/encoder"] is before
    assert moments["cluster/0/encoder"].steps == 2 and before.steps == 1


def test_fedbuff_steps_its_optimiser_on_the_buffered_mean_delta() -> None:
    rng = np.random.default_rng(3)
    shared = rng.normal(size=6).astype(np.float32)
    bases = [shared, (shared + 0.1).astype(np.float32)]
    updates = [(base + rng.normal(scale=0.2, size=6)).astype(np.float32) for base in bases]
    args = (shared, updates, bases, [0, 2], 0.5, 1.0)
    default, moments = fedbuff_optimised_step(*args, ServerOptimizerConfig(), Moments())
    assert np.array_equal(default, fedbuff_step(*args)) and moments == Moments()
    adam = ServerOptimizerConfig(name="adam", lr=0.01)
    stepped, moments = fedbuff_optimised_step(*args, adam, Moments())
    delta = fedbuff_step(*args).astype(np.float64) - shared.astype(np.float64)  # the buffer's own step, lr 1
    m, v = 0.1 * delta, 0.01 * delta**2
    np.testing.assert_allclose(stepped, shared + 0.01 * m / (np.sqrt(v) + 1e-3), rtol=1e-5)
    assert moments.steps == 1
