"""CPU results are pinned bit for bit: every method's per-client accuracy, loss and
training loss on a shortened quickstart equal the golden file recorded for this
machine's arithmetic (CPU vendor and instruction set: tests/bit_reference.py), so
no change meant to leave results alone can move a CPU number. The Intel file was
recorded on an Intel Xeon with AMX, the AMD file on an AMD EPYC (Zen 4, AVX-512) on
2026-12-05, every method in both.

On a kind of machine with no file of its own (an AVX2-only CPU, say), or a method its
file does not record yet, bits cannot be pinned in the default mode (MKL picks its
kernels by CPU vendor and model); the runs are then held to a recorded file (the
files agree with each other) within cross-machine rounding, which an Intel and an
AMD machine were measured to stay well inside (per-client accuracy within 2 of 90
test images, losses within 1e-4 relative). Record this machine's file with
`python -m tests.bit_reference`. Portable runs have one file for every machine
(tests/test_portable_bits.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from hdcfl_ray.algorithms.registry import method_names
from tests.bit_reference import arithmetic_key, golden_files, quickstart_rows
from tests.conftest import slow_beyond

GOLDEN = {key: json.loads(path.read_text()) for key, path in golden_files().items()}
KEY = arithmetic_key()
# Without a file for this machine: the tolerance for rounding across CPUs (3 rounds)
ACCURACY_TOLERANCE = 0.05  # per client, about 4 of its test images
LOSS_RELATIVE_TOLERANCE = 1e-3


def test_every_method_is_pinned_on_a_recorded_machine() -> None:
    """Every method has a golden record on at least one kind of machine, and no file
    records a method that does not exist. A method whose results were meant to change
    is re-recorded on the machine at hand (`python -m tests.bit_reference METHOD`)
    and dropped from the other machines' files until it is recorded there: those
    machines then hold it to the fresh record within cross-machine rounding."""
    assert GOLDEN, "no golden file in tests/golden"
    recorded = set().union(*(set(rows) for rows in GOLDEN.values()))
    assert recorded == set(method_names())
    for key, rows in GOLDEN.items():
        assert set(rows) <= set(method_names()), key


def assert_within_cross_machine_rounding(rows: list[list[object]], golden: list[list[object]], where: str) -> None:
    """The same clients scored, each accuracy within ACCURACY_TOLERANCE and each
    loss and training loss within LOSS_RELATIVE_TOLERANCE of the golden row."""
    assert [row[:2] for row in rows] == [row[:2] for row in golden], f"other clients were scored, {where}"
    for new, old in zip(rows, golden):
        (accuracy, *losses), (golden_accuracy, *golden_losses) = (
            [None if value is None else float.fromhex(value) for value in row[2:]] for row in (new, old)
        )
        at = f"round {new[0]} client {new[1]}, {where}"
        assert abs(accuracy - golden_accuracy) <= ACCURACY_TOLERANCE, f"accuracy {accuracy} vs {golden_accuracy}, {at}"
        for loss, golden_loss in zip(losses, golden_losses):
            assert (loss is None) == (golden_loss is None), at
            if loss is not None:
                assert loss == pytest.approx(golden_loss, rel=LOSS_RELATIVE_TOLERANCE), at


@pytest.mark.parametrize("method", slow_beyond(sorted(method_names()), fast={"hdcfl", "fedavg", "ifca"}))
def test_quickstart_bits_unchanged(tmp_path: Path, method: str) -> None:
    rows = quickstart_rows(method, tmp_path / method)
    if method in GOLDEN.get(KEY, {}):
        golden = GOLDEN[KEY][method]
        assert len(rows) == len(golden)
        changed = [(new, old) for new, old in zip(rows, golden) if new != old]
        assert not changed, f"{len(changed)} of {len(rows)} client scores moved on {KEY}, first: {changed[0]}"
        return
    # any machine that recorded the method: they agree within the tolerance (tested below)
    reference_key = min(key for key, rows in GOLDEN.items() if method in rows)
    assert_within_cross_machine_rounding(rows, GOLDEN[reference_key][method], f"{method} on {KEY} against {reference_key}")


def test_the_cross_machine_tolerance_holds_between_the_recorded_machines() -> None:
    """Every pair of recorded files agrees within the fallback tolerance: the
    tolerance is wide enough for real rounding differences between CPUs."""
    keys = sorted(GOLDEN)
    for first, second in zip(keys, keys[1:]):
        for method in sorted(set(GOLDEN[first]) & set(GOLDEN[second])):
            assert_within_cross_machine_rounding(GOLDEN[second][method], GOLDEN[first][method], f"{method}: {second} against {first}")


def test_a_machine_without_its_own_file_is_held_to_a_recorded_one(tmp_path: Path, monkeypatch) -> None:
    """The fallback path (a new kind of CPU) passes on the machines that have files too."""
    monkeypatch.setattr(sys.modules[__name__], "KEY", "NoVendor-NONE")
    test_quickstart_bits_unchanged(tmp_path, "fedavg")
