"""The verdict words the tables and docs use for a paired comparison over seeds.

Rule: with at least two seeds, a method is "ahead" of another when its score minus
the other's is positive at every seed and the mean of those differences is larger
than their sample standard deviation (the seed spread of the difference); "behind"
is the mirror image; anything else is "indistinguishable". One seed gives no verdict.
"""

from __future__ import annotations

from statistics import mean, stdev

AHEAD, BEHIND, INDISTINGUISHABLE, ONE_SEED = "ahead", "behind", "indistinguishable", "one seed"
RULE = (
    "ahead / behind: the difference has the same sign at every seed and its mean exceeds the sample std of the "
    "per-seed differences; otherwise indistinguishable (one seed: no verdict)"
)


def paired_verdict(differences: list[float]) -> str:
    """The verdict on per-seed differences (first method minus second)."""
    if len(differences) < 2:
        return ONE_SEED
    average, spread = mean(differences), stdev(differences)
    if all(d > 0 for d in differences) and average > spread:
        return AHEAD
    if all(d < 0 for d in differences) and -average > spread:
        return BEHIND
    return INDISTINGUISHABLE
