"""The rule that picks an auto knob's value from its candidates' scores: the one
`hdcfl-ray calibrate` applies (analysis/calibration_table.py, SELECTION_RULE), at
the run's one seed, over the finalists of a successive halving (plan.py). Only the validation images are read; a candidate without a
score (its run diverged) is never chosen."""

from __future__ import annotations

import math
from collections.abc import Sequence

from hdcfl_ray.contract.method import AutoValue

RULE = (
    "successive halving: every value a shortened run, the better half (at least two) the whole schedule on "
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
