"""The report's communication table and accuracy-against-communication figure, from
real runs and from runs logged before the byte columns existed ("not recorded")."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from analysis.communication import communication_table, megabytes_text
from analysis.figures import write_figures
from analysis.final_metrics import run_metrics
from analysis.run_traffic import TRAFFIC_COLUMNS, run_traffic
from analysis.runs import load_runs
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.terminal.live_view import QuietObserver
from tests.conftest import tiny_scenario


def simulate(root: Path, method: str, seed: int, **section: object) -> Path:
    scenario = tiny_scenario(
        seed=seed, algorithm={"name": method, **section}, partition={"num_clients": 4},
        protocol={"rounds": 2, "participation": 0.5}, runtime={"backend": "local", "num_cpus": 1},
    )  # fmt: skip
    run_dir = root / method / f"seed{seed}"
    run_simulation(prepare_run(build_scenario(scenario)), run_dir, QuietObserver())
    return run_dir


def as_logged_before_bytes(run_dir: Path) -> None:
    """Rewrite a run's tables without the byte columns, as a run from before them."""
    for table in ("clients", "rounds"):
        for part in sorted((run_dir / f"{table}.parquet").glob("part-*.parquet")):
            data = pq.read_table(part)
            pq.write_table(data.drop_columns([c for c in TRAFFIC_COLUMNS if c in data.column_names]), part)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("communication")
    simulate(root, "fedavg", 7)
    simulate(root, "ifca", 7, ifca={"clusters": 2})
    old_local = simulate(root, "local", 7)
    as_logged_before_bytes(old_local)
    # a second FedAvg seed logged before the columns: the table averages the recorded seed
    old_fedavg = root / "fedavg" / "seed8"
    shutil.copytree(root / "fedavg" / "seed7", old_fedavg)
    scenario = yaml.safe_load((old_fedavg / "scenario.yaml").read_text())
    (old_fedavg / "scenario.yaml").write_text(yaml.safe_dump({**scenario, "seed": 8}, sort_keys=False))
    as_logged_before_bytes(old_fedavg)
    return root


def test_the_table_gives_megabytes_per_participant_round_and_says_what_was_not_recorded(runs: Path) -> None:
    table = communication_table(run_metrics(load_runs([runs])))
    assert table is not None
    rows = {row[1].value: [cell.value for cell in row] for row in table.rows}
    assert set(rows) == {"fedavg", "ifca", "local"}
    assert rows["local"][2:6] == ["not recorded"] * 4
    fedavg_run = load_runs([runs / "fedavg" / "seed7"])[0]
    totals = run_traffic(fedavg_run.rounds.to_pylist())
    model = totals["bytes_down"] / totals["participations"]  # FedAvg downloads one full model per update
    assert rows["fedavg"][3] == megabytes_text(model / 1e6) == rows["fedavg"][2]
    assert rows["ifca"][3] == megabytes_text(2 * model / 1e6)  # IFCA's two cluster models
    assert rows["fedavg"][4] == megabytes_text((totals["bytes_up"] + totals["bytes_down"]) / 1e6)
    assert "fedavg (1 of 2 seeds)" in table.note


def test_the_report_lists_the_table_and_old_runs_still_report(runs: Path) -> None:
    import hdcfl_ray

    text = hdcfl_ray.report([runs], format="md")
    assert "### Communication: MB per participant-round" in text
    assert "| local [fewer seeds (1 of 2)] | not recorded |" in text  # the row says how few runs it rests on


def test_the_figure_is_drawn_per_setting(runs: Path, tmp_path: Path) -> None:
    written = write_figures([run for run in load_runs([runs]) if run.finished], tmp_path)
    figures = [path for path in written if path.name.startswith("communication_")]
    assert len(figures) == 1 and figures[0].stat().st_size > 0


def test_megabytes_keep_three_significant_figures() -> None:
    assert [megabytes_text(v) for v in (0.0, 0.023912, 28.69, 1234.4, float("nan"))] == ["0", "0.0239", "28.7", "1,234", "not recorded"]


def test_labels_of_methods_that_send_alike_do_not_overlap() -> None:
    from analysis.communication_figure import _label_heights

    points = [(110.0, 82.4), (110.5, 82.6), (111.0, 82.7), (110.2, 93.8), (600.0, 82.5)]
    heights = _label_heights(points, gap=0.5)
    crowd = sorted(heights[:3])
    assert all(b - a >= 0.5 - 1e-9 for a, b in zip(crowd, crowd[1:]))
    assert sum(heights[:3]) / 3 == pytest.approx((82.4 + 82.6 + 82.7) / 3)  # centred on its points
    assert heights[3] == 93.8 and heights[4] == 82.5  # far from the others: at their own heights
