"""The Gaussian mechanism on the clipped updates of a round: their sum plus N(0, std^2)
noise per coordinate, and the private mean the server steps with (DP-FedAvg).

The mean divides by a fixed `denominator`, the expected cohort size (q * N clients under
Poisson sampling with rate q from N, m under fixed-size sampling of m), never by the
number of updates that arrived: the mean stays unbiased and one client moves it by at
most clip / denominator, the sensitivity the noise is calibrated to.

A noise cohort larger than the simulated one (pfl-research's `noise_cohort_size`) is
expressed by scaling: the noise on the mean has the standard deviation it would have with
`noise_cohort_size` clients, z * clip / noise_cohort_size, while the simulated cohort's
sum is still divided by `denominator`. The guarantee is then that of the noise cohort:
the accountant is given its sampling rate (noise_cohort_size / population)."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def _vector_size(clipped: Sequence[np.ndarray], size: int | None) -> int:
    sizes = {int(np.size(vector)) for vector in clipped}
    if size is not None:
        if size < 0:
            raise ValueError(f"size: {size} is not a vector length (0 or more)")
        sizes.add(int(size))
    if not sizes:
        raise ValueError("no updates and no size: give `size`, the model's length, for a round without updates")
    if len(sizes) > 1:
        raise ValueError(f"the updates (and size) disagree on the vector length: {sorted(sizes)}")
    return sizes.pop()


def _noised_sum64(clipped: Sequence[np.ndarray], std: float, rng: np.random.Generator, size: int | None) -> np.ndarray:
    if not (math.isfinite(std) and std >= 0):
        raise ValueError(f"std: {std!r} is not a finite standard deviation (0 or more)")
    total = np.zeros(_vector_size(clipped, size), dtype=np.float64)
    for vector in clipped:
        total += np.asarray(vector, dtype=np.float64).ravel()
    # drawn even when std is 0, so the stream's later draws do not depend on the noise level
    total += rng.standard_normal(total.size) * std
    return total


def noised_sum(clipped: Sequence[np.ndarray], std: float, rng: np.random.Generator, size: int | None = None) -> np.ndarray:
    """The sum of the equal-length vectors (flattened, summed in float64) plus N(0, std^2)
    per coordinate drawn from `rng`, as float32. `size` is the length when no vector is
    given (the noise alone); given with vectors, it must agree with them."""
    return _noised_sum64(clipped, std, rng, size).astype(np.float32)


def mean_noise_std(clip: float, noise_multiplier: float, denominator: float, noise_cohort_size: int | None = None) -> float:
    """The standard deviation of the noise on each coordinate of the private mean:
    z * clip / denominator, or z * clip / noise_cohort_size when a noise cohort is given."""
    if not (math.isfinite(clip) and clip > 0):
        raise ValueError(f"clip: {clip!r} is not a positive finite L2 norm")
    if not (math.isfinite(noise_multiplier) and noise_multiplier >= 0):
        raise ValueError(f"noise_multiplier: {noise_multiplier!r} is not a finite multiplier (0 or more)")
    if not (math.isfinite(denominator) and denominator > 0):
        raise ValueError(f"denominator: {denominator!r} is not a positive expected cohort size")
    if noise_cohort_size is not None and noise_cohort_size < 1:
        raise ValueError(f"noise_cohort_size: {noise_cohort_size!r} is not a cohort size (1 or more)")
    return noise_multiplier * clip / (noise_cohort_size if noise_cohort_size is not None else denominator)


def private_mean(
    clipped: Sequence[np.ndarray],
    clip: float,
    noise_multiplier: float,
    denominator: float,
    rng: np.random.Generator,
    size: int | None = None,
    noise_cohort_size: int | None = None,
) -> np.ndarray:
    """(sum of the clipped updates + N(0, (z * clip)^2)) / denominator, as float32.

    `denominator` is the expected cohort size (q * N under Poisson sampling, m under
    fixed-size sampling): the mean is unbiased and its sensitivity is clip / denominator.
    With `noise_cohort_size`, the noise on the mean has standard deviation
    z * clip / noise_cohort_size (as if that many clients had been summed) while the sum
    is still divided by `denominator`. The updates must already be clipped to `clip`."""
    std_of_mean = mean_noise_std(clip, noise_multiplier, denominator, noise_cohort_size)
    return (_noised_sum64(clipped, std_of_mean * denominator, rng, size) / denominator).astype(np.float32)
