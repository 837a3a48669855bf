"""`hdcfl-ray report` over real runs that would mislead if reported naively: a method
that lacks a setting, a clustered method that collapsed to one group where groups are
planted, a method with fewer seeds, a sampled evaluation and an unfinished run. Every
mark must reach the Markdown, CSV and LaTeX output, and the averages over settings must
leave out the method that did not run them all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests import report_runs

ONE_GROUP = {"proximity": "elementwise", "threshold": 179.0, "threshold_unit": "degrees"}  # every client merged


def simulate(root: Path, setting: str, method: str, seed: int, **sections: object) -> Path:
    return report_runs.simulate(root, setting, method, seed, method_sections={"pacfl": ONE_GROUP}, **sections)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("report-e2e")
    for seed in (1, 2):
        simulate(root, "rotation", "hdcfl", seed)
        simulate(root, "rotation", "pacfl", seed)
        simulate(root, "sampled", "hdcfl", seed, protocol={"eval_clients": 3})
    simulate(root, "rotation", "fedavg_se", 1)  # one seed, and no run of the "sampled" setting
    killed = simulate(root, "sampled", "pacfl", 1)
    manifest = json.loads((killed / "manifest.json").read_text())
    (killed / "manifest.json").write_text(json.dumps({**manifest, "status": "interrupted"}))
    return root


@pytest.mark.parametrize("output_format", ["md", "csv", "latex"])
def test_every_misleading_row_is_marked_in_every_format(runs: Path, output_format: str) -> None:
    from cli import app

    result = CliRunner().invoke(app, ["report", str(runs), "--format", output_format])
    assert result.exit_code == 0, result.output
    text = result.stdout.replace("\\%", "%").replace("\\_", "_")
    assert "one group" in text  # PACFL merged the two planted rotation groups
    assert "fewer seeds (1 of 2)" in text  # FedAvg-SE
    assert "sampled evaluation (37.5% of the clients)" in text
    assert "without them: fedavg_se (no sampled); pacfl (no sampled)" in text
    assert "sampled/pacfl seed 1 (interrupted)" in text  # named in the tables, not only on stderr
    assert "Made from 7 runs" in text and "torch" in text and "Ray" in text


def test_a_method_missing_a_setting_has_no_macro_value_or_rank(runs: Path) -> None:
    import csv
    import io

    from cli import app

    result = CliRunner().invoke(app, ["report", str(runs), "--format", "csv"])
    assert result.exit_code == 0, result.output
    blocks = [list(csv.reader(io.StringIO(block))) for block in result.stdout.split("\n\n")]

    def rows_of(block: list[list[str]]) -> tuple[list[str], dict[str, dict[str, str]]]:
        header = next(row for row in block if row and row[0] == "Method")
        body = block[block.index(header) + 1 :]
        return header, {row[0]: dict(zip(header, row)) for row in body if row and not row[0].startswith("# ")}

    header, by_method = rows_of(blocks[0])  # table 1's form: one column per setting, then the rank and the marks
    assert header[-4:] == ["Avg. rank ↓", "Best in", "Second best in", "Flagged cells"]
    # the methods, then the trivial reference rows (tests/test_trivial_reference.py), never ranked
    assert set(by_method) == {"fedavg_se", "hdcfl", "pacfl", "reference: majority class (pooled)", "reference: majority class (own)"}
    assert by_method["reference: majority class (pooled)"]["Avg. rank ↓"] == "-"
    assert by_method["fedavg_se"]["Avg. rank ↓"] == "-" and by_method["pacfl"]["Avg. rank ↓"] == "-"
    assert by_method["hdcfl"]["Avg. rank ↓"] != "-"  # the one method run in every setting keeps its rank
    macro_header, macro = rows_of(next(block for block in blocks if "table 2 form" in block[0][0]))
    values = macro_header[1:-3]  # the macro values and the tail rank, not the mark columns
    assert {macro["fedavg_se"][c] for c in values} == {"-"} and {macro["pacfl"][c] for c in values} == {"-"}
    assert "-" not in {macro["hdcfl"][c] for c in values}
