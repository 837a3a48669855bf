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
    # the heads identify the four rotation groups by the last refresh
    assert refresh["ari_true"][-1] == pytest.approx(1.0)
    # training works: the final mean accuracy is far above chance (10%)
    assert rounds["mean_accuracy"][-1] > 0.6
