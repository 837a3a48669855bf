"""The privacy a run's releases spend: epsilon at a given delta, a guarantee from Opacus's
RDP accountant or a tighter numerical estimate from its PRV accountant, and the noise
multiplier that meets a target epsilon.

A release is `(noise_multiplier, sample_rate, steps)`: `steps` applications of the
Poisson-subsampled Gaussian mechanism with that noise multiplier (noise std / L2
sensitivity) and per-client sampling rate. Several mechanisms compose: a model release
every round and a descriptor release at some rounds are two entries."""

from __future__ import annotations

import math
import warnings
from typing import Literal, Sequence

import numpy as np

from hdcfl_ray.privacy.opacus_extra import opacus_accountants

Accountant = Literal["rdp", "prv"]
Release = tuple[float, float, int]

# noise_for_target's result spends at most the target and at least this much less
TARGET_TOLERANCE = 0.01
_LARGEST_NOISE_MULTIPLIER = 1e6
# the Renyi orders RDP is evaluated at: Opacus's defaults (1.1 .. 10.9, 12 .. 63), then up to 1024
RDP_ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) + [64, 80, 96, 128, 160, 192, 256, 384, 512, 768, 1024]


def _merged(releases: Sequence[Release]) -> list[Release] | None:
    """The releases that spend privacy, those with equal (noise multiplier, sample rate)
    merged into one with their steps summed, in order of first appearance; None when one
    of them is noiseless (an infinite epsilon)."""
    steps_by_mechanism: dict[tuple[float, float], int] = {}
    for index, (noise_multiplier, sample_rate, steps) in enumerate(releases):
        noise_multiplier, sample_rate = float(noise_multiplier), float(sample_rate)
        if math.isnan(noise_multiplier) or noise_multiplier < 0:
            raise ValueError(f"release {index}: noise multiplier {noise_multiplier!r} is not 0 or more")
        if not 0.0 <= sample_rate <= 1.0:
            raise ValueError(f"release {index}: sample rate {sample_rate!r} is not a probability (0..1)")
        if int(steps) != steps or steps < 0:
            raise ValueError(f"release {index}: steps {steps!r} is not a count (0 or more)")
        if steps == 0 or sample_rate == 0.0 or noise_multiplier == math.inf:
            continue  # releases nothing about anyone
        if noise_multiplier == 0.0:
            return None
        key = (noise_multiplier, sample_rate)
        steps_by_mechanism[key] = steps_by_mechanism.get(key, 0) + int(steps)
    return [(noise_multiplier, sample_rate, steps) for (noise_multiplier, sample_rate), steps in steps_by_mechanism.items()]


def epsilon(releases: Sequence[Release], delta: float, accountant: Accountant = "rdp") -> float:
    """Epsilon of the releases composed, at `delta`: "rdp" the guarantee of Opacus's RDP
    accountant (its default orders), "prv" the PRV accountant's numerical estimate (the
    upper end of its interval at eps_error 0.01), tighter than RDP's. 0.0 for no release;
    releases with infinite noise, no steps or sampling rate 0 count for nothing; a
    noiseless one (multiplier 0) makes it infinite."""
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta: {delta!r} is not a probability in (0, 1)")
    if accountant not in ("rdp", "prv"):
        raise ValueError(f"accountant: {accountant!r} is not one of 'rdp', 'prv'")
    history = _merged(releases)
    if history is None:
        return math.inf
    if not history:
        return 0.0
    accountants = opacus_accountants()
    tracker = accountants.RDPAccountant() if accountant == "rdp" else accountants.PRVAccountant()
    tracker.history = history  # a fresh accountant per call: no result depends on an earlier one
    # PRV's sampled mechanism takes log(1 - q), -inf at q = 1 (no sampling), where numpy
    # warns though the result is right: the warnings would reach every run's terminal.
    # Opacus also warns when the best order is the first or last one tried: the epsilon is
    # still a guarantee (RDP bounds hold at every order; an order past the range could only
    # tighten it), and target_epsilon's search tries extreme multipliers on purpose
    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        warnings.filterwarnings("ignore", message="Optimal order is the", category=UserWarning)
        if accountant == "prv":
            return float(tracker.get_epsilon(delta=delta))
        # Opacus's orders and larger ones: heavy noise puts the best order past Opacus's
        # largest (63), where its bound would be looser than it needs to be (and it warns)
        return float(tracker.get_epsilon(delta=delta, alphas=RDP_ORDERS))


def noise_for_target(target_epsilon: float, plan: Sequence[Release], delta: float, accountant: Accountant = "rdp") -> float:
    """The noise multiplier z for which the plan spends at most `target_epsilon` and at
    least target_epsilon - 0.01 (TARGET_TOLERANCE), where each plan entry is
    `(noise_scale, sample_rate, steps)` and releases with noise multiplier
    z * noise_scale. Bisection on log z keeps the end that meets the target, so the
    target is never exceeded (should the accountant's epsilon not move smoothly with z,
    the tolerance may be missed below, never above). 0.0 when the plan releases nothing."""
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise ValueError(f"privacy.target_epsilon: {target_epsilon!r} is not a positive finite epsilon")

    def spent(z: float) -> float:
        return epsilon([(z * scale, rate, steps) for scale, rate, steps in plan], delta, accountant)

    unit = _merged([(float(scale), rate, steps) for scale, rate, steps in plan])
    if unit is None:
        raise ValueError(
            f"privacy.target_epsilon: {target_epsilon} cannot be reached: a release of the plan has noise scale 0 "
            f"(no noise), which spends an infinite epsilon whatever the noise multiplier"
        )
    if not unit:
        return 0.0  # nothing released (infinite scales, no steps, sampling rate 0): no noise needed
    # a bracket low < high with spent(low) > target >= spent(high), found by doubling or halving from 1
    low = high = 1.0
    high_spent = spent(high)
    while high_spent > target_epsilon:
        low, high = high, high * 2.0
        if high > _LARGEST_NOISE_MULTIPLIER:
            raise ValueError(
                f"privacy.target_epsilon: {target_epsilon} at delta {delta} is not reached by this plan with a noise "
                f"multiplier up to {_LARGEST_NOISE_MULTIPLIER:g}; raise the target"
            )
        high_spent = spent(high)
    if low == high:
        while True:
            low = high / 2.0
            low_spent = spent(low)
            if low_spent > target_epsilon:
                break
            high, high_spent = low, low_spent
    while high_spent < target_epsilon - TARGET_TOLERANCE and high / low > 1.0 + 1e-12:
        middle = math.sqrt(low * high)
        middle_spent = spent(middle)
        if middle_spent > target_epsilon:
            low = middle
        else:
            high, high_spent = middle, middle_spent
    return high
