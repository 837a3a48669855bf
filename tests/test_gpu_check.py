"""benchmarks/gpu_check.sh --dry-run on a machine without a GPU: every step's code path
runs on the CPU with tiny sizes and the JSON has one record per step, each marked as a
dry run. Also the pieces the GPU run reads its results with (pytest's counts, the
bit-for-bit comparison of two clients tables)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from benchmarks import gpu_check

ROOT = Path(__file__).resolve().parents[1]
STEPS = ["machine", "cuda_tests", "throughput", "paper_round", "bit_identity", "paper_rot_two_rounds"]


@pytest.mark.slow  # a long end-to-end run: the slow tier (.ci/run runs it after the README's command)
def test_dry_run_writes_every_step(tmp_path: Path) -> None:
    out = tmp_path / "x.json"
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("OUT", None)
    completed = subprocess.run(
        ["bash", str(ROOT / "benchmarks/gpu_check.sh"), "--dry-run", "--no-install", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["mode"] == "dry_run" and report["ok"] is True
    for step in STEPS:
        assert report[step]["status"] == "dry_run" and report[step]["dry_run"] is True, (step, report[step])
    assert (tmp_path / "gpu_check.log").read_text().count("[gpu_check]") >= len(STEPS)
    assert report["machine"]["cpu"] and "cuda_available" in report["machine"]
    assert report["cuda_tests"]["collected"] > 0
    throughput = report["throughput"]["results"]
    assert {(row["encoder"], row["precision"]) for row in throughput} == {
        (encoder, precision) for encoder in ("small_cnn", "resnet18_cifar") for precision in ("fp32", "bf16")
    }
    assert all(row["project_samples_per_s"] > 0 and row["plain_samples_per_s"] > 0 and row["ratio_project_over_plain"] > 0 for row in throughput)
    round_ = report["paper_round"]
    # every mode, the Ray hosts and every ceiling measured; the default mode's two runs compared
    assert set(round_["modes"]) == {"one-at-a-time", "batched", "batched+tf32", "batched+bf16", "fastest"}, round_.get("skipped")
    assert all(mode["images_per_s"] > 0 and mode["over_ceilings"] for mode in round_["modes"].values())
    assert set(round_["ray"]) == {"1_hosts", "2_hosts"} and all(r["over_local_backend"] > 0 for r in round_["ray"].values())
    assert round_["ceilings"]["fp32"]["2_concurrent_loops"] > 0
    # the host's side of one batched step: no wait for the device inside the step loop
    assert round_["step_profile"]["host_waits_per_step"] == 0 and round_["step_profile"]["top_level_ops_per_step"] > 0
    assert round_["default_plan"]["hosts"] >= 1 and round_["default_plan"]["images_per_s"] > 0
    assert all(mode["hosts"] == 1 for mode in round_["modes"].values())  # one local host holding every client
    assert round_["bit_identity"]["bit_identical"] is True
    # each layout run's hosts and per round the clients that trained together, in the JSON and the log
    layouts = round_["layouts"]
    assert {"default plan", "local, one host, batched", "ray, 1 host(s) on the CPU", "ray, 2 host(s) on the CPU"} <= set(layouts)
    assert layouts["ray, 2 host(s) on the CPU"]["hosts"] == 2
    assert 0 < round_["outside_step_loop"] < 1 and round_["round_overhead"]["trained_together"] > 1
    assert all(len(layout["rounds"]) == 3 and layout["rounds"][0]["groups"] for layout in layouts.values())
    log = (tmp_path / "gpu_check.log").read_text()
    assert "layout ray, 2 host(s) on the CPU: 2 host(s)" in log and "  round 1 (" in log and " batched " in log
    assert "outside the step loop: " in log and "of a batched round of 2 clients" in log
    assert report["bit_identity"]["validate"]["returncode"] == 0
    paper = report["paper_rot_two_rounds"]
    # the CIFAR-10 copy may be absent here: then a warning, not a failure
    assert paper["data"] is not None or any("not found" in warning for warning in paper["warnings"])


def test_unknown_step_is_bad_use(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--dry-run", "--steps", "machine,nope", "--out", str(tmp_path / "x.json")],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert completed.returncode == 2 and "nope" in completed.stderr


def test_pytest_counts_from_summary_and_from_a_killed_run() -> None:
    assert gpu_check.parse_pytest("..s.\n3 passed, 1 skipped, 900 deselected in 12.0s\n") == {"passed": 3, "skipped": 1, "deselected": 900}
    killed = gpu_check.parse_pytest("....F.s [ 24%]\n..\n")
    assert killed == {"passed": 7, "failed": 1, "skipped": 1, "error": 0}
    assert gpu_check.parse_pytest("a.py::t[1]\n\n29/948 tests collected (919 deselected) in 7.35s\n")["collected"] == 29


def test_no_test_starts_past_the_deadline_the_gpu_check_sets() -> None:
    """The cuda step's budget ends by skipping the cases not yet started, so a case is
    never cut off halfway (a run stopped by SIGTERM would read as a failed test)."""
    test = "tests/test_gpu_check.py::test_pytest_counts_from_summary_and_from_a_killed_run"
    for deadline, expected in (("1", "1 skipped"), ("9999999999", "1 passed")):
        completed = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", test], cwd=ROOT,
                                   env={**os.environ, "HDCFL_TEST_DEADLINE": deadline}, capture_output=True, text=True, timeout=120)
        assert expected in completed.stdout, completed.stdout[-2000:]
        assert gpu_check.not_started_for_time(completed.stdout) == (1 if deadline == "1" else 0)
    output = ("SKIPPED [5] tests/conftest.py:30: not started: past HDCFL_TEST_DEADLINE (the time budget of the run that set it)\n"
              "SKIPPED [1] tests/test_cuda_smoke.py:31: needs a CUDA GPU\n2 passed, 6 skipped in 0.1s\n")
    assert gpu_check.parse_pytest(output) == {"passed": 2, "skipped": 6}
    assert gpu_check.not_started_for_time(output) == 5


def _clients(loss: list[float]) -> pa.Table:
    return pa.table({"round": [1, 1], "client_id": [1, 0], "host": [0, 1], "accuracy": [0.5, 0.25], "loss": loss, "train_loss": [1.0, float("nan")]})


def test_clients_tables_compare_bit_for_bit() -> None:
    first = _clients([0.1, 0.2])
    same = pa.table({name: list(reversed(first[name].to_pylist())) for name in first.column_names})  # other row order
    assert gpu_check.compare_clients_tables(first, same)["bit_identical"] is True
    moved = gpu_check.compare_clients_tables(first, _clients([0.1, math.nextafter(0.2, 1.0)]))
    assert moved["bit_identical"] is False and moved["columns_differing"] == ["loss"]
    assert 0 < moved["largest_difference"]["loss"] < 1e-15
    assert moved["columns_compared"] == ["accuracy", "loss", "train_loss"]


def test_a_runs_layout_says_per_round_and_host_which_clients_trained_together(tmp_path: Path) -> None:
    """benchmarks/round_layout.py reads the run's updates and rounds tables: round 1 split
    over two hosts (3 batched, 1 alone), round 2 on one host (4 batched)."""
    import pyarrow.parquet as pq

    from benchmarks.round_layout import layout_lines, run_layout

    pq.write_table(pa.table({"round": [1, 1, 1, 1, 2, 2, 2, 2], "client_id": [5, 0, 3, 9, 1, 2, 7, 8], "host": [0, 0, 0, 1, 0, 0, 0, 0],
                             "trained_together": [3, 3, 3, 1, 4, 4, 4, 4]}), tmp_path / "updates.parquet")
    pq.write_table(pa.table({"round": [1, 2], "wall_time_s": [2.5, 1.25], "aggregate_s": [0.1, 0.05]}), tmp_path / "rounds.parquet")
    layout = run_layout(tmp_path)
    assert layout["hosts"] == 2
    assert layout["rounds"][0] == {"round": 1, "wall_time_s": 2.5, "aggregate_s": 0.1, "groups": [
        {"host": 0, "clients": [0, 3, 5], "batched": 3}, {"host": 1, "clients": [9], "batched": 1}]}
    assert layout["updates_by_group_size"] == {"1": 1, "3": 3, "4": 4}
    lines = layout_lines("x", layout)
    assert lines[0] == "layout x: 2 host(s)"
    assert lines[1] == "  round 1 (2.5 s, aggregate 0.1 s): host 0 [0,3,5] batched 3; host 1 [9] batched 1"
    assert lines[2] == "  round 2 (1.25 s, aggregate 0.05 s): host 0 [1,2,7,8] batched 4"
    assert "1 in groups of 1 (12%)" in lines[3] and len(lines) == 4
    # the orchestrator prints both steps' shapes: paper_round's layouts and paper_rot_two_rounds' runs
    assert gpu_check.printed_layouts({"layouts": {"x": layout}}) == lines
    assert gpu_check.printed_layouts({"layouts": {"x": layout}, "outside_step_loop": None})[-1] == "outside the step loop: not measured"
    assert gpu_check.printed_layouts({"layouts": {"x": {"run": {}, "layout": layout}, "failed": {"run": {}}}}) == lines
