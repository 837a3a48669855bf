"""The run's random streams: named, disjoint across names and across seeds."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hdcfl_ray import seeding


def _states(seed: int) -> set[tuple[int, ...]]:
    """The first words of every named stream of `seed`, over a run's worth of keys."""
    states = set()
    for name in seeding.STREAM_TAGS:
        for keys in [(), *((k,) for k in range(60)), *itertools.product(range(12), range(12))]:
            states.add(tuple(seeding.seed_sequence(seed, name, *keys).generate_state(4)))
    return states


def test_streams_of_seeds_42_and_1042_share_nothing() -> None:
    assert not _states(42) & _states(1042)


def test_model_initialisations_of_seeds_42_and_1042_share_nothing() -> None:
    first = {seeding.model_init_seed(42, model) for model in range(20)}
    second = {seeding.model_init_seed(1042, model) for model in range(20)}
    assert not first & second


def test_named_streams_never_coincide_within_a_run() -> None:
    assert len(set(seeding.STREAM_TAGS.values())) == len(seeding.STREAM_TAGS)
    words = [tuple(seeding.seed_sequence(42, name, 3).generate_state(4)) for name in seeding.STREAM_TAGS]
    assert len(set(words)) == len(words)


def test_a_stream_is_fixed_by_seed_name_and_keys() -> None:
    first = seeding.rng(7, "sampling", 3).random(5)
    np.testing.assert_array_equal(first, seeding.rng(7, "sampling", 3).random(5))
    assert not np.array_equal(first, seeding.rng(7, "sampling", 4).random(5))
    assert seeding.int_seed(7, "kmeans", 1) == seeding.int_seed(7, "kmeans", 1) < 2**32


def test_an_unknown_stream_name_is_an_error() -> None:
    with pytest.raises(KeyError):
        seeding.rng(1, "no-such-stream")


def test_no_product_module_derives_a_seed_by_arithmetic() -> None:
    """Every seed goes through hdcfl_ray.seeding; `seed + ...` or `seed * ...` would collide across a sweep."""
    import pathlib
    import re

    root = pathlib.Path(seeding.__file__).parent
    pattern = re.compile(r"\bseed\w*\s*[+*]|[+*]\s*(?:self\.|scenario\.)?seed\b")
    offenders = [
        f"{path.relative_to(root)}:{number}"
        for path in root.rglob("*.py")
        if path.name != "seeding.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line.split("#")[0])
    ]
    assert offenders == []


def test_models_built_in_parallel_threads_get_their_own_seeds_initial_weights():
    """A sweep with --parallel builds each run's model in its own thread; torch's
    initialisers draw from the one global generator, so without the lock a run could
    start from another run's seed (seen once in a parallel sweep: round 1 differed
    from a rerun of the same seed)."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from hdcfl_ray.config.schema import ModelConfig
    from hdcfl_ray.models.split_model import build_split_model

    config = ModelConfig(encoder="small_cnn", width=16, feature_dim=64)

    def weights(seed: int) -> torch.Tensor:
        model = build_split_model(config, in_channels=3, num_classes=10, seed=seed)
        return torch.cat([p.detach().flatten() for p in (*model.encoder.parameters(), *model.head.parameters())])

    seeds = [s % 4 for s in range(48)]
    serial = {seed: weights(seed) for seed in set(seeds)}
    with ThreadPoolExecutor(max_workers=8) as pool:
        parallel = list(pool.map(weights, seeds))
    assert all(torch.equal(built, serial[seed]) for seed, built in zip(seeds, parallel))
