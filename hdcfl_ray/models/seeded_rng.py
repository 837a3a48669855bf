"""Building a model from a seed through torch's global CPU generator, safely from
several threads at once.

torch.nn's initialisers draw from the process-wide default generator. A sweep runs
several simulations in one process (`--parallel`), each building its models in its
own thread; without a lock one run can reseed the generator between another run's
seeding and its draws, and that run silently starts from other initial weights.
Every use of the global generator goes through `global_cpu_rng`, which holds one
process-wide lock, forks the generator (the caller's stream is restored on exit)
and seeds it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

_GLOBAL_RNG_LOCK = threading.RLock()


@contextmanager
def global_cpu_rng(seed: int | None = None) -> Iterator[None]:
    """Hold the process-wide lock on torch's CPU generator; fork it and, given a
    seed, seed it. Only the CPU generator is forked: models are built on the CPU,
    and torch.manual_seed would also queue a reseed of every GPU."""
    with _GLOBAL_RNG_LOCK, torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.default_generator.manual_seed(seed)
        yield
