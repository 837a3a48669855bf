"""The disk encoder cache: same prototypes as the memory cache, bounded memory, no files left."""

from __future__ import annotations

import os
import pickle
from typing import Any

import numpy as np
import pytest

from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.hdcfl.encoder_store import DiskEncoderStore, resolve_storage
from hdcfl_ray.hdcfl.prototypes import group_prototypes
from hdcfl_ray.runtime.backends.local_host import in_process_run
from hdcfl_ray.runtime.driver import prepare_run
from tests.conftest import tiny_scenario


def test_auto_storage_depends_on_the_cache_size_alone() -> None:
    assert resolve_storage("auto", 20, 100_000) == "memory"
    assert resolve_storage("auto", 1000, 11_173_962) == "disk"  # ResNet-18, K = 1000: 45 GB
    assert resolve_storage("memory", 1000, 11_173_962) == "memory"
    assert resolve_storage("disk", 2, 10) == "disk"


def test_disk_store_leaves_no_file_and_casts_to_its_precision(tmp_path) -> None:
    store = DiskEncoderStore(3, 5, precision="float16", directory=str(tmp_path))
    assert os.listdir(tmp_path) == []  # unlinked as soon as it is mapped
    row = store.put(1, np.array([0.1, 1.0, -2.0, 3.5, 1e-3], dtype=np.float32))
    assert row.dtype == np.float16
    np.testing.assert_allclose(row, [0.1, 1.0, -2.0, 3.5, 1e-3], rtol=1e-3)
    with pytest.raises(ValueError, match="shape"):
        store.put(0, np.zeros(4, dtype=np.float32))


def test_prototypes_from_rows_equal_prototypes_from_a_stack() -> None:
    rng = np.random.default_rng(0)
    encoders = rng.normal(size=(6, 50)).astype(np.float32)
    counts = np.array([5, 1, 3, 2, 8, 4], dtype=np.float64)
    memberships = rng.dirichlet(np.ones(3), size=6)
    for soft in (True, False):
        stacked = group_prototypes(encoders, counts, memberships, soft=soft)
        streamed = group_prototypes([row for row in encoders], counts, memberships, soft=soft)
        np.testing.assert_array_equal(stacked, streamed)


def _run(cache: str, precision: str = "float32") -> tuple[Any, list[Any]]:
    scenario = build_scenario(
        tiny_scenario(
            algorithm={
                "name": "hdcfl",
                "hdcfl": {"groups": 2, "activation_round": 2, "refresh_every": 1, "cache": cache, "cache_precision": precision},
            }
        )
    )
    run = in_process_run(prepare_run(scenario))
    return run, run.run_all()


def _accuracies(reports: list[Any], reference: str) -> list[float]:
    return [
        report_item.result.references[reference].accuracy
        for report in reports
        for report_item in report.eval_reports
        if reference in report_item.result.references
    ]


def test_disk_cache_in_float32_reproduces_the_memory_cache_exactly() -> None:
    memory_run, memory_reports = _run("memory")
    disk_run, disk_reports = _run("disk", "float32")
    assert disk_run.algorithm._disk_store is not None and memory_run.algorithm._disk_store is None
    np.testing.assert_array_equal(
        memory_run.server.state.personalisation.prototypes, disk_run.server.state.personalisation.prototypes
    )
    assert _accuracies(memory_reports, "personalized") == _accuracies(disk_reports, "personalized")
    # The disk cache lets Ray free each upload, so the client's own encoder is not sent back.
    assert _accuracies(disk_reports, "local") == []
    assert _accuracies(memory_reports, "local")


def test_disk_cache_in_float16_stays_close_to_float32() -> None:
    exact_run, _ = _run("memory")
    half_run, _ = _run("disk", "float16")
    exact = exact_run.server.state.personalisation.prototypes
    half = half_run.server.state.personalisation.prototypes
    assert np.max(np.abs(exact - half)) < 1e-2 * np.max(np.abs(exact))


def test_an_algorithm_with_a_disk_store_still_travels_to_actors() -> None:
    disk_run, _ = _run("disk")
    copy = pickle.loads(pickle.dumps(disk_run.algorithm))
    assert copy._disk_store is None and copy.cache_storage == "disk"
