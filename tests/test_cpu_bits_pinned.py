"""CPU results are pinned bit for bit: every method's per-client accuracy, loss and
training loss on a shortened quickstart equal the golden file recorded for this
machine's arithmetic (CPU vendor and instruction set: tests/bit_reference.py), so
no change meant to leave results alone can move a CPU number. The Intel file was
recorded before the GPU-path changes (sync-free loops, foreach optimizer steps,
device choice); the AMD file from the code that matched it there.

On a kind of machine with no file of its own, bits cannot be pinned (MKL rounds
differently per vendor); the runs are then held to the nearest recorded file
within cross-machine rounding, which an Intel and an AMD machine were measured to
stay well inside (per-client accuracy within 2 of 90 test images, losses within
1e-4 relative). Record this machine's file with `python -m tests.bit_reference`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hdcfl_ray.algorithms.registry import method_names
from tests.bit_reference import arithmetic_key, golden_files, quickstart_rows

GOLDEN = {key: json.loads(path.read_text()) for key, path in golden_files().items()}
KEY = arithmetic_key()
# Without a file for this machine: the tolerance for rounding across CPUs (3 rounds)
ACCURACY_TOLERANCE = 0.05  # per client, about 4 of its test images
LOSS_RELATIVE_TOLERANCE = 1e-3


def test_every_recorded_machine_pins_every_method() -> None:
    assert GOLDEN, "no golden file in tests/golden"
    for key, rows in GOLDEN.items():
        assert sorted(rows) == sorted(method_names()), key


@pytest.mark.parametrize("method", sorted(method_names()))
def test_quickstart_bits_unchanged(tmp_path: Path, method: str) -> None:
    rows = quickstart_rows(method, tmp_path / method)
    if KEY in GOLDEN:
        golden = GOLDEN[KEY][method]
        assert len(rows) == len(golden)
        changed = [(new, old) for new, old in zip(rows, golden) if new != old]
        assert not changed, f"{len(changed)} of {len(rows)} client scores moved on {KEY}, first: {changed[0]}"
        return
    reference_key, golden = next((key, rows_by_method[method]) for key, rows_by_method in sorted(GOLDEN.items()))
    assert [row[:2] for row in rows] == [row[:2] for row in golden], "other clients were scored"
    for new, old in zip(rows, golden):
        (accuracy, loss, train_loss), (golden_accuracy, golden_loss, golden_train_loss) = (
            [None if value is None else float.fromhex(value) for value in row[2:]] for row in (new, old)
        )
        where = f"round {new[0]} client {new[1]} on {KEY} against {reference_key}"
        assert abs(accuracy - golden_accuracy) <= ACCURACY_TOLERANCE, f"accuracy {accuracy} vs {golden_accuracy}, {where}"
        assert loss == pytest.approx(golden_loss, rel=LOSS_RELATIVE_TOLERANCE), where
        assert (train_loss is None) == (golden_train_loss is None), where
        if train_loss is not None:
            assert train_loss == pytest.approx(golden_train_loss, rel=LOSS_RELATIVE_TOLERANCE), where


def test_the_cross_machine_tolerance_holds_between_the_recorded_machines() -> None:
    """Every pair of recorded files agrees within the fallback tolerance: the
    tolerance is wide enough for real rounding differences between CPUs."""
    keys = sorted(GOLDEN)
    for first, second in zip(keys, keys[1:]):
        for method in method_names():
            for a, b in zip(GOLDEN[first][method], GOLDEN[second][method]):
                assert a[:2] == b[:2]
                a_values, b_values = ([None if v is None else float.fromhex(v) for v in row[2:]] for row in (a, b))
                assert abs(a_values[0] - b_values[0]) <= ACCURACY_TOLERANCE, (method, a[:2])
                for x, y in zip(a_values[1:], b_values[1:]):
                    assert (x is None and y is None) or x == pytest.approx(y, rel=LOSS_RELATIVE_TOLERANCE), (method, a[:2])


def test_a_machine_without_its_own_file_is_held_to_a_recorded_one(tmp_path: Path, monkeypatch) -> None:
    """The fallback path (a new kind of CPU) passes on the machines that have files too."""
    monkeypatch.setattr(__import__(__name__, fromlist=["KEY"]), "KEY", "NoVendor-NONE")
    test_quickstart_bits_unchanged(tmp_path, "fedavg")
