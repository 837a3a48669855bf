"""The report's statistics on hand-made runs, against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis.final_metrics import RunMetrics, average_rank, cells, macro_average, ranks_within, tail_rank
from analysis.report_tables import all_tables, to_latex, to_markdown
from hdcfl_ray.diagnostics.fairness import client_accuracy_summary


def record(setting, method, seed, mean, worst, bottom20, gap):
    values = {"mean_accuracy": mean, "worst_accuracy": worst, "bottom20_accuracy": bottom20, "gap": gap, "mean_accuracy_global": math.nan, "ari_true": math.nan}
    return RunMetrics(setting, method, seed, values)


RECORDS = [
    # setting A: a > b > c on the mean
    record("A", "a", 1, 0.90, 0.70, 0.75, 0.25), record("A", "a", 2, 0.80, 0.60, 0.65, 0.30),
    record("A", "b", 1, 0.80, 0.75, 0.78, 0.10), record("A", "b", 2, 0.80, 0.75, 0.78, 0.10),
    record("A", "c", 1, 0.70, 0.50, 0.55, 0.40), record("A", "c", 2, 0.70, 0.50, 0.55, 0.40),
    # setting B: b > a = c on the mean
    record("B", "a", 1, 0.60, 0.40, 0.45, 0.30), record("B", "b", 1, 0.70, 0.60, 0.62, 0.20), record("B", "c", 1, 0.60, 0.50, 0.52, 0.20),
]


def test_mean_and_sample_std_use_ddof_one():
    cell = cells(RECORDS, "mean_accuracy")[("A", "a")]
    assert cell.mean == pytest.approx(0.85)
    assert cell.std == pytest.approx(np.std([0.9, 0.8], ddof=1))
    assert cell.std == pytest.approx(0.0707106781)
    assert math.isnan(cells(RECORDS, "mean_accuracy")[("B", "a")].std)  # one seed: no std


def test_ranks_share_ties_and_respect_direction():
    assert ranks_within({"a": 0.6, "b": 0.7, "c": 0.6}, higher_is_better=True) == {"b": 1.0, "a": 2.5, "c": 2.5}
    assert ranks_within({"a": 0.3, "b": 0.2, "c": 0.2}, higher_is_better=False) == {"b": 1.5, "c": 1.5, "a": 3.0}


def test_average_rank_over_settings():
    # A: a 0.85 (1), b 0.80 (2), c 0.70 (3); B: b (1), a and c tie (2.5)
    assert average_rank(RECORDS) == {"a": pytest.approx((1 + 2.5) / 2), "b": pytest.approx(1.5), "c": pytest.approx(2.75)}


def test_tail_rank_averages_worst_bottom20_and_gap_ranks():
    # A worst: b .75 (1) a .65 (2) c .50 (3); bottom20: b (1) a (2) c (3); gap (lower better): b .10 (1) a .275 (2) c .40 (3)
    # B worst: b .6 (1) c .5 (2) a .4 (3); bottom20: b (1) c (2) a (3); gap: b, c tie .2 (1.5) a .3 (3)
    expected = {"a": (2 + 2 + 2 + 3 + 3 + 3) / 6, "b": (1 + 1 + 1 + 1 + 1 + 1.5) / 6, "c": (3 + 3 + 3 + 2 + 2 + 1.5) / 6}
    assert tail_rank(RECORDS) == pytest.approx(expected)


def test_macro_average_is_the_mean_of_setting_means():
    assert macro_average(RECORDS, "gap")["a"] == pytest.approx((0.275 + 0.30) / 2)


def test_bottom20_and_gap_of_client_accuracies():
    accuracies = np.array([0.9, 0.5, 0.7, 0.8, 0.6, 0.95, 0.85, 0.75, 0.65, 0.55])
    summary = client_accuracy_summary(accuracies)
    assert summary["bottom20"] == pytest.approx((0.5 + 0.55) / 2)  # ceil(0.2 * 10) = 2 lowest
    assert summary["gap"] == pytest.approx(0.95 - 0.5)
    assert summary["worst"] == 0.5 and summary["mean"] == pytest.approx(accuracies.mean())


def test_tables_mark_best_and_second_and_render():
    tables = all_tables(RECORDS)
    mean_table = tables[0]
    row_a = next(row for row in mean_table.rows if row[0].value == "a")
    row_b = next(row for row in mean_table.rows if row[0].value == "b")
    assert row_a[1].mark == "best" and row_a[1].value == "85.00 ± 7.07"
    assert row_b[1].mark == "second"
    assert "**85.00 ± 7.07**" in to_markdown(tables)
    assert "\\textbf{85.00 $\\pm$ 7.07}" in to_latex(tables)


def test_ablation_variants_become_rows_of_one_table():
    from analysis.report_tables import variant_tables

    records = [
        record("rot", "hdcfl", 1, 0.80, 0.70, 0.72, 0.2),
        record("rot", "hdcfl", 2, 0.82, 0.72, 0.74, 0.2),
        record("rot.groups-1", "hdcfl", 1, 0.78, 0.66, 0.70, 0.2),
        record("rot.groups-1", "hdcfl", 2, 0.78, 0.68, 0.70, 0.2),
        record("other", "fedavg_se", 1, 0.5, 0.4, 0.45, 0.2),
    ]
    (table,) = variant_tables(records)
    assert [row[0].value for row in table.rows] == ["as run", "groups-1"]
    assert table.rows[0][2].value == "81.00 ± 1.41"
    assert table.rows[1][3].value == "67.00 ± 1.41"


def paired(setting, seed, own, shared):
    values = {"mean_accuracy": own, "worst_accuracy": own - 0.2, "bottom20_accuracy": own - 0.1, "gap": 0.3,
              "mean_accuracy_global": shared, "worst_accuracy_global": shared - 0.25, "bottom20_accuracy_global": shared - 0.1,
              "ari_true": 1.0}
    return RunMetrics(setting, "hdcfl", seed, values)


def test_personalisation_gain_is_paired_by_seed():
    from analysis.final_metrics import personalisation_gains
    from analysis.report_tables import gain_table

    runs = [paired("R", 1, 0.50, 0.40), paired("R", 2, 0.30, 0.28), paired("R", 3, 0.60, 0.61)]
    gain = personalisation_gains(runs + RECORDS)[("R", "hdcfl")]  # methods without a global score are left out
    assert gain.gain.mean == pytest.approx((0.10 + 0.02 - 0.01) / 3)
    assert gain.gain.std == pytest.approx(np.std([0.10, 0.02, -0.01], ddof=1))  # paired: far below the std of either column
    assert gain.personalised.mean == pytest.approx(1.4 / 3) and gain.seeds_helped == 2
    worst = personalisation_gains(runs, "worst_accuracy")[("R", "hdcfl")]
    assert worst.gain.mean == pytest.approx(0.05 + (0.10 + 0.02 - 0.01) / 3)
    table = gain_table(runs + RECORDS)
    assert table is not None and len(table.rows) == 1
    assert [cell.value for cell in table.rows[0]][:4] == ["R", "46.67 ± 15.28", "43.00 ± 16.70", "+3.67 ± 5.69"]
    assert table.rows[0][-1].value == "2 of 3"
    assert gain_table(RECORDS) is None  # no HDC-FL run
    other = [RunMetrics("R", "fedbabu", r.seed, r.values) for r in runs]
    assert gain_table(other) is None  # other methods' global scores are not HDC-FL's reference
    # ... they get a table of their own: what the personalisation step adds to the method's shared model
    from analysis.report_tables import shared_model_gain_table

    shared = shared_model_gain_table(other + runs)
    assert shared is not None and len(shared.rows) == 1  # HDC-FL stays in its own table
    assert [cell.value for cell in shared.rows[0]][:5] == ["R", "fedbabu", "46.67 ± 15.28", "43.00 ± 16.70", "+3.67 ± 5.69"]
    assert shared_model_gain_table(runs) is None


def test_paired_table_lists_the_reference_minus_each_method_seed_by_seed() -> None:
    from analysis.paired_table import paired_table

    def run(method: str, seed: int, mean: float) -> RunMetrics:
        return RunMetrics("S", method, seed, {"mean_accuracy": mean, "worst_accuracy": mean - 0.1, "bottom20_accuracy": mean - 0.05})

    records = [run("hdcfl", 1, 0.50), run("hdcfl", 2, 0.60), run("local", 1, 0.45), run("local", 2, 0.62), run("ifca", 1, 0.4),
               run("fedce", 3, 0.3)]  # fmt: skip
    table = paired_table(records)
    assert table is not None and [row[1].value for row in table.rows] == ["fedce", "ifca", "local"]
    fedce, ifca = ([cell.value for cell in row] for row in table.rows[:2])
    # ifca lacks seed 2: paired on seed 1 alone, and flagged so
    assert ifca[2:4] == ["1", "+10.00"] and ifca[-1] == "one seed / one seed / one seed"
    assert table.rows[1][1].flags == ("paired on fewer seeds (1 of 2)",)
    # fedce shares no seed: a row that says so, nothing compared
    assert set(fedce[2:-1]) == {"-"} and fedce[-1] == "not paired: no seed in common (hdcfl: 1 / 2; fedce: 3)"
    cells_text = [cell.value for cell in table.rows[2]]
    assert cells_text[:4] == ["S", "local", "1 / 2", "+5.00 / -2.00"] and cells_text[-2] == "1 of 2"
    # the reference itself lacking a seed the others ran: every pair is flagged
    short = paired_table([run("hdcfl", 1, 0.5), run("local", 1, 0.45), run("local", 2, 0.62)])
    assert short is not None and short.rows[0][1].flags == ("paired on fewer seeds (1 of 2)",)
    assert cells_text[-1] == "indistinguishable / indistinguishable / indistinguishable"  # signs differ across seeds
    assert "same sign at every seed" in table.note
    assert paired_table([run("local", 1, 0.4)]) is None


@pytest.mark.parametrize(
    ("differences", "verdict"),
    [
        ([2.0, 2.5, 1.5], "ahead"),            # positive at every seed, mean 2.0 > spread 0.5
        ([0.2, 3.0, 0.1], "indistinguishable"),  # positive at every seed, but mean 1.1 < spread 1.6
        ([1.0, -0.1, 2.0], "indistinguishable"),  # one seed behind
        ([-1.0, -1.2, -0.9], "behind"),
        ([0.0, 0.0, 0.0], "indistinguishable"),  # a tie is not ahead
        ([3.0], "one seed"),
    ],
)
def test_the_verdict_rule(differences, verdict) -> None:
    from analysis.verdict import paired_verdict

    assert paired_verdict(differences) == verdict
