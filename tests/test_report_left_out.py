"""`hdcfl-ray report` over real runs says what each table left out, in Markdown, CSV and
LaTeX: a method that lacks one of the reference's seeds is paired on the seeds it
shares (one with none gets a row saying so), a validation-scored run beside test runs
enters no test table, rank or macro value, a tie for best survives in CSV, a flag marks
only the metric it is defined on, and the tables derived from the runs carry the
sampled-evaluation and fewer-seeds marks of the runs behind them."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.report_runs import simulate

FORMATS = ("md", "csv", "latex")
# one class per client: Local predicts its one class, FedAvg's shared model misses whole clients
ONE_CLASS = {"kind": "label_subset", "k": 1, "num_clients": 8, "test_per_client": 30}
SAMPLED = {"eval_clients": 3}  # 3 of 8 clients scored: 37.5%


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("report-left-out")
    for seed in (1, 2):
        for method in ("hdcfl", "local", "fedavg"):
            simulate(root / "main", "ls1", method, seed, partition=ONE_CLASS)
            simulate(root / "main", "sampled", method, seed, protocol=SAMPLED)
        simulate(root / "tie", "tie", "fedavg", seed)  # the same run under two names: a tie for best
        simulate(root / "tie", "tie", "fedavg", seed, label="fedavg-again")
    simulate(root / "main", "ls1", "fedavg_se", 1, partition=ONE_CLASS)  # lacks seed 2
    simulate(root / "main", "ls1", "ifca", 3, partition=ONE_CLASS)  # shares no seed with hdcfl
    simulate(root / "validation", "ls1", "hdcfl", 1, partition={**ONE_CLASS, "validation_fraction": 0.2})
    simulate(root / "validation", "ls1", "local", 1, partition={**ONE_CLASS, "validation_fraction": 0.2})
    for seed in (1, 2):  # a test-scored calibration of one method's knob (calibrate --oracle names it so)
        simulate(root / "oracle", "ls1.oracle.groups-3", "hdcfl", seed, partition=ONE_CLASS, method_sections={"hdcfl": {"groups": 3}})
    return root


def report(*paths: Path, output_format: str) -> str:
    from cli import app

    result = CliRunner().invoke(app, ["report", *map(str, paths), "--format", output_format])
    assert result.exit_code == 0, result.output
    return result.stdout.replace("\\%", "%").replace("\\_", "_").replace("$\\pm$", "±")


def tables(text: str, output_format: str) -> dict[str, list[list[str]]]:
    """Title -> rows (each a list of cells, header first) of every table of a report."""
    found: dict[str, list[list[str]]] = {}
    if output_format == "csv":
        title = None
        for row in csv.reader(io.StringIO(text)):
            if row and row[0].startswith("# ") and title is None:
                title = row[0][2:]
                found[title] = []
            elif not row or row[0].startswith("# "):
                title = None
            elif title is not None:
                found[title].append(row)
        return found
    if output_format == "md":
        for block in text.split("### ")[1:]:
            lines = block.splitlines()
            rows = [line.strip("|").split(" | ") for line in lines if line.startswith("|") and not line.startswith("|---")]
            found[lines[0]] = [[cell.strip() for cell in row] for row in rows]
        return found
    for block in text.split("\\begin{table}")[1:]:
        title = re.search(r"\\caption\{(.*)\}", block).group(1)  # type: ignore[union-attr]
        body = block.split("\\toprule")[1].split("\\bottomrule")[0]
        found[title] = [[cell.strip() for cell in line.rstrip("\\ ").split(" & ")] for line in body.splitlines() if " & " in line]
    return found


def table(found: dict[str, list[list[str]]], starts: str) -> list[list[str]]:
    (title,) = [title for title in found if title.startswith(starts)]
    return found[title]


def row_of(rows: list[list[str]], *first: str) -> list[str]:
    (row,) = [row for row in rows[1:] if all(re.sub(r"\s*\[.*", "", cell) == want for cell, want in zip(row, first))]
    return row


@pytest.mark.parametrize("output_format", FORMATS)
def test_a_method_without_the_references_seeds_is_paired_on_those_it_shares_or_named(runs: Path, output_format: str) -> None:
    paired = table(tables(report(runs / "main", output_format=output_format), output_format), "Paired differences")
    verdict = -4 if output_format == "csv" else -1  # CSV ends each row with its three mark columns
    fedavg_se = row_of(paired, "ls1", "fedavg_se")
    assert fedavg_se[2] == "1" and fedavg_se[verdict].count("one seed") == 3  # its one shared seed
    ifca = row_of(paired, "ls1", "ifca")
    assert ifca[verdict] == "not paired: no seed in common (hdcfl: 1 / 2; ifca: 3)"
    if output_format == "csv":  # the flag is a column of its own
        assert fedavg_se[-1] == "Method: paired on fewer seeds (1 of 2)"
    else:
        assert fedavg_se[1] == "fedavg_se [paired on fewer seeds (1 of 2)]"
    assert {row[1].split(" [")[0] for row in paired[1:] if row[0] == "ls1"} == {"fedavg", "fedavg_se", "ifca", "local"}


@pytest.mark.parametrize("output_format", FORMATS)
def test_a_validation_run_beside_test_runs_enters_no_test_table_rank_or_macro(runs: Path, output_format: str) -> None:
    alone = tables(report(runs / "main", output_format=output_format), output_format)
    beside = tables(report(runs / "main", runs / "validation", output_format=output_format), output_format)
    validation = table(beside, "Validation-scored runs")
    assert [row[:3] for row in validation[1:]] == [["ls1 (validation)", "hdcfl", "1"], ["ls1 (validation)", "local", "1"]]
    assert set(beside) - set(alone) == {next(title for title in beside if title.startswith("Validation-scored runs"))}
    for title, rows in alone.items():  # every test table, its ranks and macro values, as without the validation runs
        assert beside[title] == rows, title
    assert all("(validation)" not in cell for title, rows in beside.items() if not title.startswith("Validation") for row in rows for cell in row)


def test_the_python_report_keeps_validation_runs_apart_too(runs: Path) -> None:
    import hdcfl_ray

    text = hdcfl_ray.report([runs / "main", runs / "validation"], format="md")
    assert "### Validation-scored runs" in text and "| ls1 (validation) | hdcfl | 1 |" in text
    assert "enter no test-accuracy table" in text.split("### Validation-scored runs")[1]


def test_against_a_method_with_only_validation_runs_is_refused_saying_so(runs: Path) -> None:
    from cli import app

    only_validation = runs / "validation"
    result = CliRunner().invoke(app, ["report", str(runs / "tie"), str(only_validation), "--against", "hdcfl", "--format", "md"])
    assert result.exit_code == 2
    assert "its runs here are all validation-scored" in result.output


@pytest.mark.parametrize("output_format", FORMATS)
def test_a_tie_for_best_is_marked_on_both_rows_in_every_format(runs: Path, output_format: str) -> None:
    text = report(runs / "tie", output_format=output_format)
    mean = table(tables(text, output_format), "Mean client test accuracy (%), mean")
    rows = [row_of(mean, "fedavg"), row_of(mean, "fedavg-again")]
    assert rows[0][1] == rows[1][1]  # the same runs: the same value
    if output_format == "csv":
        assert mean[0][-3:] == ["Best in", "Second best in", "Flagged cells"]
        assert [row[-3] for row in rows] == ["tie", "tie"] and [row[-2] for row in rows] == ["", ""]
    else:
        bold = "**" if output_format == "md" else "\\textbf{"
        assert all(row[1].startswith(bold) for row in rows)


@pytest.mark.parametrize("output_format", FORMATS)
def test_a_flag_marks_only_the_cells_of_the_metric_it_is_defined_on(runs: Path, output_format: str) -> None:
    found = tables(report(runs / "main", output_format=output_format), output_format)
    mean, worst = table(found, "Mean client test accuracy (%), mean"), table(found, "Final worst-client")
    fedavg_mean, fedavg_worst = row_of(mean, "fedavg"), row_of(worst, "fedavg")
    if output_format == "csv":
        mean_flags, worst_flags = fedavg_mean[-1], fedavg_worst[-1]
        assert not any("[" in cell for cell in fedavg_mean + fedavg_worst)  # values stay plain numbers
    else:
        mean_flags, worst_flags = fedavg_mean[1], fedavg_worst[1]
    assert "below Local" in mean_flags and "worst client 0%" not in mean_flags
    assert "worst client 0%" in worst_flags and "below Local" not in worst_flags
    gap = row_of(table(found, "Final best-minus-worst gap"), "fedavg")
    assert not any("below Local" in cell or "worst client" in cell for cell in gap)


@pytest.mark.parametrize("output_format", FORMATS)
def test_derived_tables_carry_the_sampled_evaluation_and_fewer_seeds_marks(runs: Path, output_format: str) -> None:
    found = tables(report(runs / "main", output_format=output_format), output_format)
    sampled = "sampled evaluation (37.5% of the clients)"

    def marks(row: list[str]) -> str:
        return row[-1] if output_format == "csv" else " ".join(row)

    macro = table(found, "Client-level results macro-averaged")
    assert f"{sampled} in sampled" in marks(row_of(macro, "hdcfl"))
    assert "fewer seeds (1 of 2) in ls1" in marks(row_of(macro, "fedavg_se"))
    paired = table(found, "Paired differences")
    assert sampled in marks(row_of(paired, "sampled", "local"))
    assert f"{sampled} for both" in marks(row_of(paired, "sampled", "fedavg"))  # hdcfl's runs sampled alike
    gain = table(found, "HDC-FL: gain of the prototype mixture")
    assert sampled in marks(row_of(gain, "sampled")) and sampled not in marks(row_of(gain, "ls1"))


def test_test_scored_calibration_runs_beside_test_runs_leave_ranks_and_macro_values_alone(runs: Path) -> None:
    alone = tables(report(runs / "main", output_format="csv"), "csv")
    beside = tables(report(runs / "main", runs / "oracle", output_format="csv"), "csv")
    mean_alone, mean_beside = (table(found, "Mean client test accuracy (%), mean") for found in (alone, beside))
    assert "ls1.oracle.groups-3" in mean_beside[0] and "ls1.oracle.groups-3" not in mean_alone[0]

    def ranks(rows: list[list[str]]) -> dict[str, str]:
        return {row[0]: row[rows[0].index("Avg. rank ↓")] for row in rows[1:]}

    assert ranks(mean_beside) == ranks(mean_alone)  # fedavg and local keep their ranks
    macro = "Client-level results macro-averaged"
    assert table(beside, macro) == table(alone, macro)
    text = report(runs / "main", runs / "oracle", output_format="md")
    assert "leave out the variant columns of a setting here (replays, calibration values): ls1.oracle.groups-3" in text
