"""Whether a run's learning curve had flattened when it stopped.

A results table compares the methods where their curves have flattened; a table made
while some still climb ranks them by how fast they learn, not by what they reach. The
report says so on the row (analysis/row_flags.py, "still rising") from two numbers of
each run's mean client accuracy over its evaluated rounds:

* the late rise: a least-squares line through the evaluated rounds of the run's last
  third (at least its last two evaluated rounds), its slope times a third of the rounds:
  what the curve gained over that third, with the round-to-round noise averaged out;
* the total rise: the final evaluated accuracy less the first.

A row is still rising when, averaged over its seeds, the late rise exceeds
RISING_MIN_POINTS (an absolute floor), RISING_MIN_SHARE of the total rise (so that a curve
that gained 40 points and still creeps up by one is flat, and one that gained 5 and is
gaining 2 is not), and RISING_MIN_NOISE times its own noise (the standard error of the
fitted rise from the points' scatter about the line, combined over the seeds), so that a
curve wandering about a plateau, or about chance, is not read as a trend. With only two
points in the last third the scatter cannot be measured and the rise stands as fitted.

A row is falling when, averaged over its seeds, the late rise is below -FALLING_MIN_POINTS
and its size exceeds RISING_MIN_NOISE times its noise: the curve had passed its best and
was going down when the run stopped (models overfitting their clients' data, or
diverging), so its final numbers are below what the run reached earlier.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

# the share of the run's rounds at its end that the late rise is fitted on
LATE_SHARE = 1 / 3
# a late rise at or below this (a fraction: 0.01 = 1 percentage point) is flat whatever the total rise
RISING_MIN_POINTS = 0.01
# a late rise at or below this share of the total rise is flat
RISING_MIN_SHARE = 0.05
# the late rise must exceed this many standard errors of itself
RISING_MIN_NOISE = 2.0
# a late fall larger than this (a fraction: 0.01 = 1 percentage point) can be a trend
FALLING_MIN_POINTS = 0.01
RISING_RULE = (
    f"over the last third of the rounds the mean accuracy rose by more than "
    f"{100 * RISING_MIN_POINTS:g} pp and by more than {100 * RISING_MIN_SHARE:g}% of its rise since the first "
    "evaluated round and by more than twice its standard error (a least-squares line through the evaluated rounds of that "
    "third; means over the seeds): "
    "the table ranks the methods before they converged; run more rounds"
)

FALLING_RULE = (
    f"over the last third of the rounds the mean accuracy fell by more than {100 * FALLING_MIN_POINTS:g} pp and by more "
    "than twice its standard error (a least-squares line through the evaluated rounds of that third; means over the "
    "seeds): the curve had passed its best when the runs stopped (overfitting or diverging), so the final value is "
    "below what they reached earlier; look at the curves"
)


class CurveRises(NamedTuple):
    """A curve's rises as fractions (0.01 = one point); NaN where the curve is too short."""

    late: float  # the rise fitted over the last third of the rounds
    total: float  # the last evaluated accuracy less the first
    late_error: float  # the standard error of `late` (0 where two points leave no scatter to measure)

    @property
    def rising(self) -> bool:
        """The rule below on this one curve."""
        return still_rising([self.late], [self.total], [self.late_error])

    @property
    def falling(self) -> bool:
        """The falling rule above on this one curve."""
        return still_falling([self.late], [self.late_error])

    def notice(self) -> str | None:
        """What the end of a run says of a curve still rising or falling (None for a flat one)."""
        if self.rising:
            return (
                f"the mean accuracy was still rising when the run stopped: +{100 * self.late:.1f} pp over the last third "
                "of the rounds; its final numbers are not where it converges (more rounds: protocol.rounds; docs/results.md)"
            )
        if self.falling:
            return (
                f"the mean accuracy was falling when the run stopped: {100 * self.late:.1f} pp over the last third of the "
                "rounds; its final numbers are below what it reached earlier (overfitting or diverging: see the curve; "
                "docs/results.md)"
            )
        return None


NO_CURVE = CurveRises(math.nan, math.nan, math.nan)


def scored_curve(rounds: Iterable[Mapping[str, Any]]) -> list[tuple[int, float]]:
    """(round, mean client accuracy) of every evaluated round among a run's rounds rows, as scored."""
    return [
        (int(row["round"]), float(row["mean_accuracy"])) for row in rounds if row.get("evaluated") and row.get("mean_accuracy") is not None
    ]


def rounds_curve(rounds: Iterable[Mapping[str, Any]]) -> list[tuple[int, float]]:
    """(round, mean client accuracy) of every evaluated round, one quantity throughout: the
    curve the trend is read from. A method that personalises at its final evaluation only
    (FedBABU fine-tunes then) scores its other rounds with the shared model; its final round
    enters with its shared-model score (`mean_accuracy_global`), so that the step from the
    shared to the personalised model is not read as learning. A method personalised from
    some round on (HDC-FL once its groups are active) keeps its scores."""
    rows = [row for row in rounds if row.get("evaluated") and row.get("mean_accuracy") is not None]
    curve = scored_curve(rows)
    final_only = len(rows) > 1 and bool(rows[-1].get("personalized")) and not any(row.get("personalized") for row in rows[:-1])
    shared = rows[-1].get("mean_accuracy_global") if rows else None
    if final_only and shared is not None:
        curve[-1] = (curve[-1][0], float(shared))
    return curve


def curve_rises(curve: Sequence[tuple[int, float]]) -> CurveRises:
    """The rises of a curve of (round, mean accuracy) points, accuracies as fractions; NaN
    for all three with fewer than three evaluated rounds (too short to have a trend)."""
    points = sorted((int(r), float(a)) for r, a in curve if a is not None and not math.isnan(float(a)))
    if len(points) < 3:
        return NO_CURVE
    last_round = points[-1][0]
    span = last_round * LATE_SHARE
    late = [p for p in points if p[0] >= last_round - span]
    if len(late) < 2:
        late = points[-2:]
    slope, slope_error = _fit(late)
    return CurveRises(slope * span, points[-1][1] - points[0][1], slope_error * span)


class CurvePeak(NamedTuple):
    """A curve's best evaluated point: its mean accuracy (a fraction) and its round; NaN for an empty curve."""

    accuracy: float
    round: float


def curve_peak(curve: Sequence[tuple[int, float]]) -> CurvePeak:
    """The evaluated round of highest mean accuracy (the earliest of ties): read beside the
    final value, it says whether a run ended below what it had reached."""
    points = [(int(r), float(a)) for r, a in curve if a is not None and not math.isnan(float(a))]
    if not points:
        return CurvePeak(math.nan, math.nan)
    best_round, best = min(points, key=lambda point: (-point[1], point[0]))
    return CurvePeak(best, float(best_round))


def still_rising(late_rises: Sequence[float], total_rises: Sequence[float], late_errors: Sequence[float] | None = None) -> bool:
    """The rule above, on the rises of a row's runs (NaN ones left out); without
    `late_errors` the noise test is left out."""
    total = [v for v in total_rises if not math.isnan(v)]
    late = _late_trend(late_rises, late_errors)
    if late is None or not total:
        return False
    late_mean, noise = late
    total_mean = sum(total) / len(total)
    return late_mean > RISING_MIN_POINTS and late_mean > RISING_MIN_SHARE * max(total_mean, 0.0) and late_mean > RISING_MIN_NOISE * noise


def still_falling(late_rises: Sequence[float], late_errors: Sequence[float] | None = None) -> bool:
    """The falling rule above, on the late rises of a row's runs (NaN ones left out);
    without `late_errors` the noise test is left out."""
    late = _late_trend(late_rises, late_errors)
    if late is None:
        return False
    late_mean, noise = late
    return late_mean < -FALLING_MIN_POINTS and -late_mean > RISING_MIN_NOISE * noise


def _late_trend(late_rises: Sequence[float], late_errors: Sequence[float] | None) -> tuple[float, float] | None:
    """The mean late rise over the seeds (NaN ones left out) and its noise: the standard
    error of the mean of independent seeds' rises (0 without errors); None without a rise."""
    late = [v for v in late_rises if not math.isnan(v)]
    if not late:
        return None
    errors = [v for v in late_errors or [] if not math.isnan(v)]
    noise = math.sqrt(sum(e * e for e in errors)) / len(errors) if errors else 0.0
    return sum(late) / len(late), noise


def _fit(points: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """The least-squares slope of accuracy against round and its standard error (0 for two points)."""
    xs = [float(r) for r, _ in points]
    ys = [a for _, a in points]
    x_mean, y_mean = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - x_mean) ** 2 for x in xs)
    if spread <= 0:
        return 0.0, 0.0
    slope = sum((x - x_mean) * (y - y_mean) for x, y in zip(xs, ys)) / spread
    if len(points) < 3:
        return slope, 0.0
    residuals = sum((y - (y_mean + slope * (x - x_mean))) ** 2 for x, y in zip(xs, ys))
    return slope, math.sqrt(residuals / (len(points) - 2) / spread)
