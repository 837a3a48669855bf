"""The rule that picks an auto knob's value from its candidates' scores: the one
`hdcfl-ray calibrate` applies (analysis/calibration_table.py, SELECTION_RULE), at
the run's one seed, over the finalists of a successive halving (plan.py). Only the validation images are read; a candidate without a
score (its run diverged) is never chosen."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from hdcfl_ray.auto_knobs.plan import finalists
from hdcfl_ray.contract.method import AutoValue

RULE = (
    "successive halving: every value a shortened run, the better half (at least two, and every value tied with "
    "the last of them) the whole schedule on "
    "two draws of the validation images held out of each client's training data; of those, the highest final mean "
    "client accuracy averaged over the draws (ties: the smaller value)"
)


def choose(scores: Sequence[tuple[AutoValue, float]]) -> AutoValue | None:
    """The value with the highest score; of equal scores the first (the grid is listed
    smallest first); None when no candidate has a score."""
    best: tuple[AutoValue, float] | None = None
    for value, score in scores:
        if math.isnan(score):
            continue
        if best is None or score > best[1]:
            best = (value, score)
    return None if best is None else best[0]


def better_half(scores: Sequence[tuple[AutoValue, float]]) -> list[AutoValue]:
    """Rung 2's values, smallest first: the better half of the scored values (at least
    two; plan.finalists), and every value whose score equals the last of them, so that
    an exact tie (candidates all at chance after the shortened schedule, say) never cuts
    a value on its place in the grid."""
    scored = [(value, score) for value, score in scores if not math.isnan(score)]
    ranked = sorted(scored, key=lambda item: (-item[1], item[0]))
    keep = finalists(len(ranked))
    if keep == 0:
        return []
    cut = ranked[keep - 1][1]
    return sorted(value for value, score in ranked if score >= cut)


def middle_twin(root: AutoValue, roots: Mapping[AutoValue, AutoValue]) -> AutoValue:
    """Of the values that gave `root`'s run (`roots`: each scored value -> the value whose
    run it is), the middle one: the clustering they share holds from the smallest to the
    largest of them."""
    twins = sorted(value for value, its_root in roots.items() if its_root == root) or [root]
    return twins[(len(twins) - 1) // 2]


def first_rung_pick(scores: Mapping[AutoValue, float], roots: Mapping[AutoValue, AutoValue]) -> AutoValue | None:
    """The rule's value among rung 1's scores (of values that gave the same run, the middle one)."""
    best = choose(sorted(scores.items()))
    return None if best is None else middle_twin(roots.get(best, best), roots)


def finalists_pick(means: Mapping[AutoValue, float], roots: Mapping[AutoValue, AutoValue]) -> AutoValue | None:
    """The rule's value among the finalists' means over their draws (of values that gave
    the same run in rung 1, the middle one); None when no finalist has a score."""
    best = choose(sorted(means.items()))
    return None if best is None else middle_twin(roots.get(best, best), roots)
