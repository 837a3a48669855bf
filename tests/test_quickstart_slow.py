"""The README's quickstart, whole: 30 rounds on digits with HDC-FL (a median of 36 s on 2 shared cores)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from cli import app

QUICKSTART = Path(__file__).resolve().parent.parent / "scenarios" / "quickstart.yaml"


@pytest.mark.slow
@pytest.mark.auto_knobs  # the quickstart chooses HDC-FL's G itself, as a new user's run does
@pytest.mark.usefixtures("ray_session")
def test_quickstart_recovers_the_rotation_groups_and_writes_every_table(tmp_path):
    run_dir = tmp_path / "quickstart"
    result = CliRunner().invoke(app, ["simulate", str(QUICKSTART), "--out", str(run_dir), "--quiet"])
    assert result.exit_code == 0, result.output
    rounds = pq.read_table(run_dir / "rounds.parquet").to_pydict()
    refresh = pq.read_table(run_dir / "refresh.parquet").to_pydict()
    clients = pq.read_table(run_dir / "clients.parquet")
    assert rounds["round"] == list(range(1, 31))
    assert clients.num_rows == 20 * 30
    # the heads find the rotation groups by the last refresh: G is chosen on held-out images
    # (3 on the machines measured, two rotation groups merged: README), so each group found
    # holds whole rotation groups, and never a part of one
    last = refresh["round"][-1]
    found: dict[int, set[int]] = {}
    for row in clients.to_pylist():
        if row["round"] == last:
            found.setdefault(row["true_group"], set()).add(row["group"])
    assert len(found) == 4 and all(len(groups) == 1 for groups in found.values()), found
    assert refresh["num_groups"][-1] >= 2 and refresh["ari_true"][-1] > 0.5
    # training works: the final mean accuracy is far above chance (10%)
    assert rounds["mean_accuracy"][-1] > 0.6
