"""The report's participation split: final-round accuracy of the clients that trained
in that round beside that of the clients that sat it out, from the per-client table."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest

from analysis.final_metrics import RunMetrics
from analysis.participation_split import DIFFERENCE, NON_PARTICIPANTS, PARTICIPANTS, participation_split
from analysis.report_tables import all_tables, participation_table, to_markdown
from analysis.runs import RunRecord


def record_with_clients(rows: list[tuple[int, bool, float]]) -> RunRecord:
    rounds, participated, accuracy = (list(column) for column in zip(*rows))
    clients = pa.table({"round": rounds, "participated": participated, "accuracy": accuracy})
    empty = pa.table({"round": pa.array([], pa.int32())})
    return RunRecord(run_dir=None, scenario={}, manifest={}, rounds=empty, clients=clients, refresh=empty)


def test_split_reads_only_the_given_round_and_both_sides():
    run = record_with_clients([(5, True, 0.1), (10, True, 0.9), (10, True, 0.7), (10, False, 0.2), (10, False, math.nan)])
    split = participation_split(run, 10)
    assert split[PARTICIPANTS] == pytest.approx(0.8)
    assert split[NON_PARTICIPANTS] == pytest.approx(0.2)  # the unscored client is left out
    assert split[DIFFERENCE] == pytest.approx(0.6)


def test_full_participation_has_no_split():
    split = participation_split(record_with_clients([(3, True, 0.5), (3, True, 0.6)]), 3)
    assert split[PARTICIPANTS] == pytest.approx(0.55)
    assert math.isnan(split[NON_PARTICIPANTS]) and math.isnan(split[DIFFERENCE])


def run(method, seed, trained, rest):
    values = {"mean_accuracy": trained, "worst_accuracy": rest, "bottom20_accuracy": rest, "gap": 0.1,
              PARTICIPANTS: trained, NON_PARTICIPANTS: rest, DIFFERENCE: trained - rest}  # fmt: skip
    return RunMetrics("ls3", method, seed, values)


def test_table_pairs_the_difference_by_seed():
    runs = [run("ifca", 1, 0.80, 0.50), run("ifca", 2, 0.70, 0.50), run("hdcfl", 1, 0.85, 0.84), run("hdcfl", 2, 0.86, 0.83)]
    table = participation_table(runs)
    rows = {row[1].value: [cell.value for cell in row[2:]] for row in table.rows}
    assert rows["ifca"] == ["75.00 ± 7.07", "50.00 ± 0.00", "+25.00 ± 7.07"]
    assert rows["hdcfl"] == ["85.50 ± 0.71", "83.50 ± 0.71", "+2.00 ± 1.41"]
    assert "sat it out" in to_markdown(all_tables(runs))


def test_no_table_without_partial_participation():
    full = [RunMetrics("ls3", "hdcfl", seed, {"mean_accuracy": 0.8, "worst_accuracy": 0.6, "bottom20_accuracy": 0.6, "gap": 0.1}) for seed in (1, 2)]
    assert participation_table(full) is None
    assert "sat it out" not in to_markdown(all_tables(full))
