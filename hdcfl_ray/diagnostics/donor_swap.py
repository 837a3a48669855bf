"""Donor-swap diagnostic, the maths (docs/hdcfl.md, "Donor-swap diagnostic";
paper tables 4, 14, 15): does head similarity predict which donor encoders help
a target client?

Inputs are (T, T) matrices for one run, indexed [target, donor]:
- `loss_delta[t, d]`: target t's test loss with (encoder_d, head_t) minus its loss
  with the reference (encoder_t, head_t); negative = the swap helps;
- `acc_delta[t, d]`: the same for accuracy, as a fraction (0.01 = 1 pp);
- `similarity[t, d]`: cosine similarity of head descriptors.
The diagonal (t == d) is never used. Plain numpy/scipy/sklearn; no torch, no Ray.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
from scipy.stats import spearmanr
from sklearn.metrics import average_precision_score, roc_auc_score

NUM_QUINTILES = 5


@dataclass(frozen=True)
class DonorSwapRun:
    """One run's per-target values (a unit = one target of one seed) and its
    pooled pair-level scores. Accuracy gains are in percentage points."""

    spearman_rho: np.ndarray  # (T,) low-rank similarity vs loss benefit
    spearman_rho_raw: np.ndarray  # (T,) raw-head similarity vs loss benefit
    top1_minus_random_pp: np.ndarray  # (T,)
    quintile_gain_pp: np.ndarray  # (T, 5), Q1 = closest donors
    auroc: float
    ap: float
    auroc_raw: float
    ap_raw: float
    beneficial_rate: float


@dataclass(frozen=True)
class DonorSwapSummary:
    """Table 4 (and 14, 15) quantities averaged over runs (seeds); per-target values
    are averaged over target x seed units, ignoring undefined (NaN) ones."""

    spearman_rho: float
    auroc: float
    ap: float
    beneficial_rate: float
    ap_lift: float
    top1_minus_random_pp: float
    quintile_gain_pp: np.ndarray  # (5,)
    quintile_se_pp: np.ndarray  # (5,) sample std / sqrt(units)
    spearman_rho_raw: float
    auroc_raw: float
    num_units: int


# ---- validation ----
def _square(matrix: np.ndarray, name: str) -> np.ndarray:
    array = np.asarray(matrix, dtype=np.float64)
    if array.ndim != 2 or array.shape[0] != array.shape[1] or array.shape[0] < 2:
        raise ValueError(f"{name} must be a square (targets, donors) matrix with at least 2 clients, got shape {array.shape}")
    return array


def _same_shape(reference: np.ndarray, other: np.ndarray, names: tuple[str, str]) -> None:
    if reference.shape != other.shape:
        raise ValueError(f"{names[0]} has shape {reference.shape} but {names[1]} has shape {other.shape}; both must be (T, T)")


def off_diagonal(matrix: np.ndarray) -> np.ndarray:
    """Boolean mask of the pairs t != d."""
    size = np.asarray(matrix).shape[0]
    return ~np.eye(size, dtype=bool)


def _donors(row: np.ndarray, target: int) -> np.ndarray:
    return np.delete(row, target)


# ---- per-run quantities ----
def beneficial(loss_delta: np.ndarray) -> np.ndarray:
    """True where the donor's encoder lowers the target's loss; the diagonal is False."""
    loss_delta = _square(loss_delta, "loss_delta")
    return (loss_delta < 0) & off_diagonal(loss_delta)


def beneficial_rate(loss_delta: np.ndarray) -> float:
    """Fraction of off-diagonal pairs whose swap is beneficial."""
    loss_delta = _square(loss_delta, "loss_delta")
    return float(beneficial(loss_delta)[off_diagonal(loss_delta)].mean())


def spearman_per_target(similarity: np.ndarray, loss_delta: np.ndarray) -> np.ndarray:
    """Per target, Spearman rho between similarity and loss benefit (-loss_delta)
    over donors d != t; NaN where undefined (fewer than 2 donors, a constant row)."""
    similarity = _square(similarity, "similarity")
    loss_delta = _square(loss_delta, "loss_delta")
    _same_shape(similarity, loss_delta, ("similarity", "loss_delta"))
    rhos = np.full(similarity.shape[0], np.nan)
    for target in range(similarity.shape[0]):
        sims = _donors(similarity[target], target)
        benefit = -_donors(loss_delta[target], target)
        if sims.size < 2 or np.ptp(sims) == 0 or np.ptp(benefit) == 0:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rhos[target] = float(spearmanr(sims, benefit).statistic)
    return rhos


def auroc_ap(similarity: np.ndarray, is_beneficial: np.ndarray) -> tuple[float, float]:
    """AUROC and average precision of similarity as a score for "beneficial",
    pooled over all off-diagonal pairs; (NaN, NaN) when only one class occurs."""
    similarity = _square(similarity, "similarity")
    is_beneficial = np.asarray(is_beneficial, dtype=bool)
    _same_shape(similarity, is_beneficial, ("similarity", "beneficial"))
    mask = off_diagonal(similarity)
    scores, labels = similarity[mask], is_beneficial[mask]
    if labels.all() or not labels.any():
        return math.nan, math.nan
    return float(roc_auc_score(labels, scores)), float(average_precision_score(labels, scores))


def top1_minus_random(similarity: np.ndarray, acc_delta: np.ndarray) -> np.ndarray:
    """Per target, accuracy gain (pp) of the most similar donor minus the mean gain
    over all donors d != t (what a random donor gives in expectation)."""
    similarity = _square(similarity, "similarity")
    acc_delta = _square(acc_delta, "acc_delta")
    _same_shape(similarity, acc_delta, ("similarity", "acc_delta"))
    values = np.empty(similarity.shape[0])
    for target in range(similarity.shape[0]):
        sims = _donors(similarity[target], target)
        gains = 100.0 * _donors(acc_delta[target], target)
        values[target] = gains[int(np.argmax(sims))] - gains.mean()
    return values


def quintile_gains(distance: np.ndarray, acc_delta: np.ndarray) -> np.ndarray:
    """Per target, donors d != t sorted by head distance (stable, closest first) and
    split into 5 near-equal bins; the mean accuracy gain (pp) of each bin. A bin is
    NaN when a target has fewer than 5 donors and the bin is empty."""
    distance = _square(distance, "distance")
    acc_delta = _square(acc_delta, "acc_delta")
    _same_shape(distance, acc_delta, ("distance", "acc_delta"))
    gains = np.full((distance.shape[0], NUM_QUINTILES), np.nan)
    for target in range(distance.shape[0]):
        order = np.argsort(_donors(distance[target], target), kind="stable")
        donor_gains = 100.0 * _donors(acc_delta[target], target)[order]
        for quintile, part in enumerate(np.array_split(donor_gains, NUM_QUINTILES)):
            if part.size:
                gains[target, quintile] = part.mean()
    return gains


def analyse_run(
    loss_delta: np.ndarray,
    acc_delta: np.ndarray,
    similarity_lowrank: np.ndarray,
    similarity_raw: np.ndarray,
) -> DonorSwapRun:
    """Every per-run quantity of the diagnostic for one run (one seed)."""
    is_beneficial = beneficial(loss_delta)
    auroc, ap = auroc_ap(similarity_lowrank, is_beneficial)
    auroc_raw, ap_raw = auroc_ap(similarity_raw, is_beneficial)
    return DonorSwapRun(
        spearman_rho=spearman_per_target(similarity_lowrank, loss_delta),
        spearman_rho_raw=spearman_per_target(similarity_raw, loss_delta),
        top1_minus_random_pp=top1_minus_random(similarity_lowrank, acc_delta),
        quintile_gain_pp=quintile_gains(1.0 - np.asarray(similarity_lowrank, dtype=np.float64), acc_delta),
        auroc=auroc,
        ap=ap,
        auroc_raw=auroc_raw,
        ap_raw=ap_raw,
        beneficial_rate=beneficial_rate(loss_delta),
    )


# ---- across runs ----
def _nanmean(values: np.ndarray) -> float:
    values = np.asarray(values, dtype=np.float64)
    finite = values[~np.isnan(values)]
    return float(finite.mean()) if finite.size else math.nan


def standard_error(values: np.ndarray) -> float:
    """Sample standard deviation / sqrt(n) over the defined (non-NaN) values;
    NaN with fewer than 2 of them."""
    values = np.asarray(values, dtype=np.float64)
    finite = values[~np.isnan(values)]
    if finite.size < 2:
        return math.nan
    return float(finite.std(ddof=1) / math.sqrt(finite.size))


def summarise(units: list[DonorSwapRun]) -> DonorSwapSummary:
    """Per-target values averaged over all target x seed units; pooled scores
    (AUROC, AP, beneficial rate) averaged over runs; AP lift = AP - beneficial rate
    of the averages. Quintile standard errors are over target x seed units."""
    if not units:
        raise ValueError("summarise needs at least one run")
    rho = np.concatenate([run.spearman_rho for run in units])
    rho_raw = np.concatenate([run.spearman_rho_raw for run in units])
    top1 = np.concatenate([run.top1_minus_random_pp for run in units])
    quintiles = np.concatenate([run.quintile_gain_pp for run in units], axis=0)
    ap = _nanmean(np.array([run.ap for run in units]))
    rate = _nanmean(np.array([run.beneficial_rate for run in units]))
    return DonorSwapSummary(
        spearman_rho=_nanmean(rho),
        auroc=_nanmean(np.array([run.auroc for run in units])),
        ap=ap,
        beneficial_rate=rate,
        ap_lift=ap - rate,
        top1_minus_random_pp=_nanmean(top1),
        quintile_gain_pp=np.array([_nanmean(quintiles[:, q]) for q in range(NUM_QUINTILES)]),
        quintile_se_pp=np.array([standard_error(quintiles[:, q]) for q in range(NUM_QUINTILES)]),
        spearman_rho_raw=_nanmean(rho_raw),
        auroc_raw=_nanmean(np.array([run.auroc_raw for run in units])),
        num_units=int(top1.size),
    )
