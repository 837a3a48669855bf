"""The adaptive clip of Andrew et al. (NeurIPS 2021, "Differentially Private Learning with
Adaptive Clipping"): each round the clip moves geometrically toward the target quantile of
the clients' update norms, steered by a noisy count of the updates it did not clip, and
the noise budget is split between that count and the clipped mean (their Theorem 1)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True, kw_only=True)
class AdaptiveClip:
    """The adaptive clip's state between rounds, plain floats (a checkpoint stores it as
    JSON): the current clip C, the target quantile gamma of the update norms, the
    learning rate eta of the geometric update and the noise multiplier sigma_b of the
    count of unclipped updates."""

    clip: float
    target_quantile: float = 0.5
    learning_rate: float = 0.2
    count_noise_multiplier: float

    def __post_init__(self) -> None:
        for name in ("clip", "target_quantile", "learning_rate", "count_noise_multiplier"):
            object.__setattr__(self, name, float(getattr(self, name)))
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise ValueError(f"clip: {self.clip!r} is not a positive finite L2 norm")
        if not 0.0 <= self.target_quantile <= 1.0:
            raise ValueError(f"target_quantile: {self.target_quantile!r} is not a quantile (0..1)")
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise ValueError(f"learning_rate: {self.learning_rate!r} is not a positive finite rate")
        if not (math.isfinite(self.count_noise_multiplier) and self.count_noise_multiplier >= 0):
            raise ValueError(f"count_noise_multiplier: {self.count_noise_multiplier!r} is not a finite multiplier (0 or more)")


def noisy_unclipped_fraction(
    norms: Sequence[float], clip: float, count_noise_multiplier: float, denominator: float, rng: np.random.Generator
) -> float:
    """b_hat = (#{norm <= clip} + N(0, sigma_b^2)) / denominator, with sigma_b the count
    noise multiplier: each client's indicator b_i is 0 or 1 (sensitivity 1), and, as for
    the mean, `denominator` is the expected cohort size. One normal is drawn from `rng`
    even when sigma_b is 0."""
    if not (math.isfinite(count_noise_multiplier) and count_noise_multiplier >= 0):
        raise ValueError(f"count_noise_multiplier: {count_noise_multiplier!r} is not a finite multiplier (0 or more)")
    if not (math.isfinite(denominator) and denominator > 0):
        raise ValueError(f"denominator: {denominator!r} is not a positive expected cohort size")
    unclipped = int(np.count_nonzero(np.asarray(norms, dtype=np.float64) <= clip))
    return float((unclipped + rng.standard_normal() * count_noise_multiplier) / denominator)


def next_clip(state: AdaptiveClip, clipped_count_noisy_fraction: float) -> float:
    """The next round's clip, C * exp(-eta * (b_hat - gamma)), where b_hat
    (`clipped_count_noisy_fraction`, noisy_unclipped_fraction's value) is the noisy
    fraction of updates whose norm was at most C: when more than the target quantile went
    unclipped the clip shrinks, when fewer it grows."""
    if not math.isfinite(clipped_count_noisy_fraction):
        raise ValueError(f"clipped_count_noisy_fraction: {clipped_count_noisy_fraction!r} is not a finite fraction")
    return float(state.clip * math.exp(-state.learning_rate * (clipped_count_noisy_fraction - state.target_quantile)))


def value_noise_multiplier(total_noise_multiplier: float, count_noise_multiplier: float) -> float:
    """The noise multiplier of the clipped sum, z_delta = (z^-2 - (2 sigma_b)^-2)^(-1/2), such
    that it and the count released with sigma_b together are as private as one Gaussian
    mechanism with multiplier z (Andrew et al., Theorem 1). Needs 2 sigma_b > z."""
    z, sigma_b = total_noise_multiplier, count_noise_multiplier
    if not (math.isfinite(z) and z > 0):
        raise ValueError(f"noise multiplier: {z!r} is not a positive finite multiplier")
    if not (sigma_b > 0 and 2.0 * sigma_b > z):
        raise ValueError(
            f"count noise multiplier {sigma_b!r} is too small for the noise multiplier {z!r}: the count of unclipped "
            f"updates takes a share of the privacy budget only when 2 * count noise multiplier > noise multiplier "
            f"(Andrew et al. 2021, Theorem 1); choose a count noise multiplier above {z / 2:g} (the paper uses the "
            f"expected cohort size / 20)"
        )
    return float((z**-2 - (2.0 * sigma_b) ** -2) ** -0.5)
