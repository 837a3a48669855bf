"""benchmarks/cuda_agreement.py: its comparison of two devices' round-1 means holds them to
the cuda suite's tolerances, and a case name it does not know stops it before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import cuda_agreement


def _write(path: Path, records: list[dict]) -> str:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return str(path)


def test_compare_holds_round_one_means_to_the_suites_tolerance(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gpu = _write(tmp_path / "gpu.jsonl", [{"case": "hdcfl:small_cnn", "round1": [0.50, 1.00]},
                                          {"case": "fedavg:small_cnn", "round1": [0.50, 1.00]},
                                          {"case": "local:small_cnn", "not_started": "past the budget"}])
    close = _write(tmp_path / "close.jsonl", [{"case": "hdcfl:small_cnn", "round1": [0.45, 1.10]},
                                              {"case": "fedavg:small_cnn", "round1": [0.59, 0.90]}])
    assert cuda_agreement.main(["compare", gpu, close]) == 0
    assert capsys.readouterr().out.count("| yes |") == 2
    far = _write(tmp_path / "far.jsonl", [{"case": "hdcfl:small_cnn", "round1": [0.35, 1.00]},  # 15 points apart
                                          {"case": "fedavg:small_cnn", "round1": [0.50, 1.30]}])  # loss 23% apart
    assert cuda_agreement.main(["compare", gpu, far]) == 1
    assert capsys.readouterr().out.count("**no**") == 2


def test_an_unknown_case_stops_the_run_before_anything_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.jsonl"
    assert cuda_agreement.main(["run", "--gpus", "0", "--cases", "hdcfl:tiny_cnn", "--out", str(out)]) == 2
    assert "hdcfl:tiny_cnn" in capsys.readouterr().err and not out.exists()
