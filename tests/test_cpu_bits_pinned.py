"""CPU results are pinned bit for bit: every method's per-client accuracy, loss and
training loss on a shortened quickstart equal the golden file recorded before the
GPU-path changes (sync-free loops, foreach optimizer steps, device choice), so no
change made for CUDA moves a CPU number. Regenerate only for a change meant to
alter results: python -m tests.bit_reference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hdcfl_ray.algorithms.registry import method_names
from tests.bit_reference import GOLDEN, quickstart_rows

GOLDEN_ROWS = json.loads(GOLDEN.read_text())


def test_every_method_has_pinned_bits() -> None:
    assert sorted(GOLDEN_ROWS) == sorted(method_names())


@pytest.mark.parametrize("method", sorted(GOLDEN_ROWS))
def test_quickstart_bits_unchanged(tmp_path: Path, method: str) -> None:
    rows = quickstart_rows(method, tmp_path / method)
    assert len(rows) == len(GOLDEN_ROWS[method])
    changed = [(new, old) for new, old in zip(rows, GOLDEN_ROWS[method]) if new != old]
    assert not changed, f"{len(changed)} of {len(rows)} client scores moved, first: {changed[0]}"
