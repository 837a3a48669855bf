"""The report's peak table (analysis/curve_peaks.py): a run that ended below the best it
had reached says so, even where its curve fell too gently for the "falling" flag."""

from __future__ import annotations

import math
import random

from hypothesis import given
from hypothesis import strategies as st

from analysis.curve_peaks import TITLE, peak_table
from analysis.final_metrics import RunMetrics
from analysis.report_tables import all_tables, to_markdown
from hdcfl_ray.diagnostics.curve_trend import curve_peak, curve_rises

# mean accuracy by evaluated round (every 5) of the Shakespeare stand-in's FedRep at seed 42, 120 rounds
# (results/natural-standins-120): best at round 30, then down by more than four points
STANDIN_FEDREP = [36.1, 47.9, 51.1, 52.6, 52.6, 53.5, 52.6, 52.8, 51.6, 51.8, 50.3, 50.8, 50.7, 51.0, 49.7, 50.4,
                  50.2, 50.2, 49.8, 49.7, 49.7, 49.8, 49.3, 49.1]  # fmt: skip


def points(values: list[float], every: int = 5) -> list[tuple[int, float]]:
    return [(every * (i + 1), v / 100) for i, v in enumerate(values)]


def record(method: str, seed: int, values: list[float]) -> RunMetrics:
    curve = points(values)
    late, total, error = curve_rises(curve)
    best, best_round = curve_peak(curve)
    final = values[-1] / 100
    metrics = {"mean_accuracy": final, "worst_accuracy": final - 0.1, "bottom20_accuracy": final - 0.05, "gap": 0.2,
               "ari_true": math.nan, "num_groups": math.nan, "late_rise": late, "total_rise": total, "late_rise_error": error,
               "peak_accuracy": best, "peak_round": best_round}  # fmt: skip
    return RunMetrics("shakespeare", method, seed, metrics)


def test_the_peak_is_the_best_evaluated_round_the_earliest_of_ties_and_nan_without_a_curve() -> None:
    assert curve_peak([(5, 0.2), (10, 0.5), (15, 0.5), (20, 0.4)]) == (0.5, 10.0)
    assert all(math.isnan(v) for v in curve_peak([]))
    assert curve_peak([(5, math.nan), (10, 0.3)]) == (0.3, 10.0)


@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=40))
def test_no_evaluated_round_is_above_the_peak_and_the_peak_is_one_of_them(values: list[float]) -> None:
    curve = [(3 * (i + 1), v) for i, v in enumerate(values)]
    best, best_round = curve_peak(curve)
    assert (int(best_round), best) in curve and all(v <= best for _, v in curve)


def test_a_run_past_its_best_shows_how_far_below_it_ended_though_not_flagged_falling() -> None:
    seeds = random.sample(range(10_000), 3)  # any seeds: the values are the rows'
    runs = [record("fedrep", seed, STANDIN_FEDREP) for seed in seeds] + [record("fedavg", seed, [30.0, 50.0, 58.0, 59.0]) for seed in seeds]
    table = peak_table(runs)
    assert table is not None
    rows = {row[1].value: [cell.value for cell in row] for row in table.rows}
    assert rows["fedrep"][2:6] == ["49.10 ± 0.00", "53.50 ± 0.00", "30, 30, 30", "-4.40 ± 0.00"]
    assert rows["fedavg"][4:6] == ["20, 20, 20", "+0.00 ± 0.00"]
    assert TITLE in to_markdown(all_tables(runs))


def test_a_run_that_fell_before_its_last_third_shows_it_here_and_is_not_flagged_falling() -> None:
    # up to 55 by round 30, down to 50 by round 80, flat over the last third: the flag reads only the last third
    fell_early = [30.0, 45.0, 52.0, 54.0, 55.0, 55.0, 54.0, 53.0, 52.0, 51.0, 50.5, 50.0, 50.1, 49.9, 50.0, 50.1, 49.9, 50.0]
    runs = [record("apfl", seed, fell_early) for seed in random.sample(range(10_000), 3)]
    table = peak_table(runs)
    assert table is not None
    (row,) = [[cell.value for cell in row] for row in table.rows]
    assert row[3:6] == ["55.00 ± 0.00", "25, 25, 25", "-5.00 ± 0.00"] and "falling" not in row[6]


def test_runs_without_a_curve_make_no_table() -> None:
    short = record("fedavg", 1, [30.0, 50.0])  # two evaluated rounds: no trend, no table
    assert peak_table([short]) is None
    bare = RunMetrics("shakespeare", "fedavg", 1, {"mean_accuracy": 0.5, "late_rise": 0.0})  # logged before the peak existed
    assert peak_table([bare]) is None
