"""Whether a run's learning curve had flattened when it stopped.

A results table compares the methods where their curves have flattened; a table made
while some still climb ranks them by how fast they learn, not by what they reach. The
report says so on the row (analysis/row_flags.py, "still rising") from two numbers of
each run's mean client accuracy over its evaluated rounds:

* the late rise: a least-squares line through the evaluated rounds of the run's last
  third (at least its last two evaluated rounds), its slope times a third of the rounds:
  what the curve gained over that third, with the round-to-round noise averaged out;
* the total rise: the final evaluated accuracy less the first.

A row is still rising when, averaged over its seeds, the late rise exceeds both
RISING_MIN_POINTS (an absolute floor, so that a flat curve's noise is not a trend) and
RISING_MIN_SHARE of the total rise (so that a curve that gained 40 points and still
creeps up by one is flat, and one that gained 5 and is gaining 2 is not).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# the share of the run's rounds at its end that the late rise is fitted on
LATE_SHARE = 1 / 3
# a late rise at or below this (a fraction: 0.01 = 1 percentage point) is flat whatever the total rise
RISING_MIN_POINTS = 0.01
# a late rise at or below this share of the total rise is flat
RISING_MIN_SHARE = 0.05
RISING_RULE = (
    f"over the last third of the rounds the mean accuracy rose by more than "
    f"{100 * RISING_MIN_POINTS:g} pp and by more than {100 * RISING_MIN_SHARE:g}% of its rise since the first "
    "evaluated round (a least-squares line through the evaluated rounds of that third; means over the seeds): "
    "the table ranks the methods before they converged; run more rounds"
)


def curve_rises(curve: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """(late rise, total rise) of a curve of (round, mean accuracy) points, accuracies
    as fractions; NaN for both with fewer than three evaluated rounds (too short to
    have a trend of its own)."""
    points = sorted((int(r), float(a)) for r, a in curve if a is not None and not math.isnan(float(a)))
    if len(points) < 3:
        return math.nan, math.nan
    last_round = points[-1][0]
    span = last_round * LATE_SHARE
    late = [p for p in points if p[0] >= last_round - span]
    if len(late) < 2:
        late = points[-2:]
    return _slope(late) * span, points[-1][1] - points[0][1]


def still_rising(late_rises: Sequence[float], total_rises: Sequence[float]) -> bool:
    """The rule above, on the rises of a row's runs (NaN ones left out)."""
    late = [v for v in late_rises if not math.isnan(v)]
    total = [v for v in total_rises if not math.isnan(v)]
    if not late or not total:
        return False
    late_mean, total_mean = sum(late) / len(late), sum(total) / len(total)
    return late_mean > RISING_MIN_POINTS and late_mean > RISING_MIN_SHARE * max(total_mean, 0.0)


def _slope(points: Sequence[tuple[int, float]]) -> float:
    xs = [float(r) for r, _ in points]
    ys = [a for _, a in points]
    x_mean, y_mean = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - x_mean) ** 2 for x in xs)
    return sum((x - x_mean) * (y - y_mean) for x, y in zip(xs, ys)) / spread if spread > 0 else 0.0
