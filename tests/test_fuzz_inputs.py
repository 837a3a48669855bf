"""Fuzzing what a user can hand hdcfl-ray: scenario files (YAML structure, anchors and
aliases, duplicate keys, nesting, keys and values), `--set` values, sweep files and
data tables. Every case must exit 0 or 2, never with a traceback, within a bounded
time and memory, and an exit 2 of `simulate` leaves no run folder. Derandomized and
bounded for CI; docs/reliability.md lists the fault classes."""

from __future__ import annotations

import io
import struct
import tempfile
import time
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from PIL import Image
from typer.testing import CliRunner

from cli import app
from hdcfl_ray.config.schema import DatasetConfig
from hdcfl_ray.data.sources import load_dataset
from hdcfl_ray.errors import ScenarioError
from tests.conftest import tiny_scenario

runner = CliRunner()
FUZZ = dict(derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
# per case: CPU seconds of this process (the command runs in it), which a busy machine
# does not stretch as it stretches wall time; an input that blows up (a YAML bomb, deep
# nesting) costs minutes, well-formed ones a fraction of a second
CPU_SECONDS = 10.0
PEAK_BYTES = 300 * 2**20  # Python allocations while the command runs

BASE = yaml.safe_dump(tiny_scenario(protocol={"rounds": 1}, runtime={"backend": "local"}), sort_keys=False)
SECTIONS = ["dataset", "partition", "model", "algorithm", "protocol", "runtime", "checkpoint", "output", "unused"]
KEYS = ["protocol.rounds", "protocol.batch_size", "partition.num_clients", "model.width", "seed", "name", "output.dir", "dataset.path"]
SCALARS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=40),
    st.sampled_from(["x" * 300, "${NOT_SET_HDCFL}", "a\x00b", "[", "{", "*x", "&x", "!!python/object:os.system", "1e400"]),
)


def _flow(value) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10**9).strip().removesuffix("...").strip()


@st.composite
def yaml_fragments(draw) -> str:
    kind = draw(st.sampled_from(["bomb", "self", "duplicate", "deep", "value", "merge", "chain"]))
    key = draw(st.sampled_from(SECTIONS))
    if kind == "bomb":
        levels, fan_out = draw(st.integers(1, 12)), draw(st.integers(1, 12))
        lines = [f"{key}:", '  b0: &b0 "lol"'] + [
            f"  b{level}: &b{level} [{', '.join([f'*b{level - 1}'] * fan_out)}]" for level in range(1, levels + 1)
        ]
        return "\n".join(lines)
    if kind == "self":
        return f"{key}: &me {draw(st.sampled_from(['[1, *me]', '{a: *me}', '[[*me]]']))}"
    if kind == "duplicate":
        return f"{key}: {_flow(draw(SCALARS))}\n{key}: {_flow(draw(SCALARS))}"
    if kind == "deep":
        depth = draw(st.integers(1, 3000))
        return f"{key}: {'[' * depth}{']' * depth}"
    if kind == "merge":
        return f"{key}:\n  <<: &m {{rounds: 2}}\n  rounds: {_flow(draw(SCALARS))}"
    if kind == "chain":
        length = draw(st.integers(1, 300))
        return "\n".join([f"{key}:", "  c0: &c0 [1]"] + [f"  c{i}: &c{i} [*c{i - 1}]" for i in range(1, length)])
    section, _, name = draw(st.sampled_from(KEYS)).rpartition(".")
    value = _flow(draw(SCALARS))
    return f"{section}: {{{name}: {value}}}" if section else f"{name}: {value}"


def _bounded(invoke):
    """Run `invoke()`, returning its result, the CPU seconds it took and its peak Python allocation."""
    tracemalloc.start()
    started = time.process_time()
    try:
        result = invoke()
        return result, time.process_time() - started, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _assert_clean(result, seconds: float, peak: int) -> None:
    detail = f"exit {result.exit_code}\n{result.output[-3000:]}\n{result.exception!r}"
    assert result.exit_code in (0, 2), detail
    assert "Traceback" not in result.output, detail
    assert seconds < CPU_SECONDS, f"{seconds:.1f} CPU s\n{detail}"
    assert peak < PEAK_BYTES, f"{peak / 2**20:.0f} MB\n{detail}"


@pytest.fixture(autouse=True)
def _in_a_temporary_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative output.dir values land here


@settings(max_examples=60, **FUZZ)
@given(fragments=st.lists(yaml_fragments(), min_size=1, max_size=3))
def test_scenario_files_exit_0_or_2_quickly_and_in_little_memory(fragments):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "scenario.yaml"
        path.write_text(BASE + "\n".join(fragments) + "\n")
        result, seconds, peak = _bounded(lambda: runner.invoke(app, ["validate", str(path)]))
        _assert_clean(result, seconds, peak)


@settings(max_examples=12, **FUZZ)
@given(fragments=st.lists(yaml_fragments(), min_size=1, max_size=2))
def test_simulate_leaves_no_run_folder_when_it_exits_2(fragments):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "scenario.yaml"
        path.write_text(BASE + "\n".join(fragments) + "\n")
        out = Path(folder) / "run"
        result = runner.invoke(app, ["simulate", str(path), "--out", str(out), "-q", "--set", "checkpoint.every=null"])
        assert result.exit_code in (0, 2) and "Traceback" not in result.output, result.output
        if result.exit_code == 2:
            assert not out.exists(), f"exit 2 left {sorted(p.name for p in out.iterdir())}"


SET_VALUES = st.one_of(
    st.text(max_size=60),
    st.integers(1, 3000).map(lambda depth: "[" * depth + "]" * depth),
    st.integers(1, 3000).map(lambda depth: "{a: " * depth + "1" + "}" * depth),
    st.sampled_from(["&a [*a]", "{a: 1, a: 2}", "*undefined", "!!binary AAAA", "x" * 100_000, "[" * 10_000]),
)


@settings(max_examples=60, **FUZZ)
@given(key=st.sampled_from(KEYS + ["a." * 40 + "b", "protocol..rounds", "", "=="]), value=SET_VALUES)
def test_set_values_exit_0_or_2_quickly_and_in_little_memory(key, value):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "scenario.yaml"
        path.write_text(BASE)
        result, seconds, peak = _bounded(lambda: runner.invoke(app, ["validate", str(path), "--set", f"{key}={value}"]))
        _assert_clean(result, seconds, peak)
        assert len(result.output) < 10_000


SWEEP_VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=4), st.dictionaries(st.text(max_size=8), SCALARS, max_size=3))


@settings(max_examples=40, **FUZZ)
@given(
    seeds=st.one_of(SWEEP_VALUES, st.lists(st.integers(-5, 5), max_size=4)),
    algorithms=st.one_of(SWEEP_VALUES, st.lists(st.sampled_from(["fedavg", "hdcfl", "all", "nope"]), max_size=3)),
    overrides=st.one_of(SWEEP_VALUES, st.dictionaries(st.sampled_from(KEYS), SCALARS, max_size=2)),
    extra=st.dictionaries(st.sampled_from(["out", "bogus", "scenarios"]), SWEEP_VALUES, max_size=1),
)
def test_sweep_files_exit_0_or_2_and_exit_2_runs_nothing(seeds, algorithms, overrides, extra, monkeypatch):
    import hdcfl_ray.sweeps.runner as sweep_runner

    ran: list[int] = []

    def record(runs, *args, **kwargs):  # the runs themselves are tested elsewhere
        ran.append(len(runs))
        return sweep_runner.SweepOutcome()

    monkeypatch.setattr(sweep_runner, "run_sweep", record)
    with tempfile.TemporaryDirectory() as folder:
        scenario = Path(folder) / "tiny.yaml"
        scenario.write_text(BASE)
        document = {"scenarios": ["tiny.yaml"], "seeds": seeds, "algorithms": algorithms, "set": overrides, "out": "sw", **extra}
        sweep_file = Path(folder) / "sweep.yaml"
        sweep_file.write_text(yaml.safe_dump(document))
        result, seconds, peak = _bounded(lambda: runner.invoke(app, ["sweep", str(sweep_file)]))
        _assert_clean(result, seconds, peak)
        if result.exit_code == 2:
            assert not ran and not (Path(folder) / "sw").exists()


def _png(width: int, height: int, declared: tuple[int, int] | None = None) -> bytes:
    if declared is None:
        buffer = io.BytesIO()
        Image.fromarray(np.zeros((height, width, 3), dtype=np.uint8)).save(buffer, format="PNG")
        return buffer.getvalue()

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", declared[0], declared[1], 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


IMAGES = st.one_of(
    st.just(_png(6, 6)),
    st.binary(max_size=64),
    st.tuples(st.integers(1, 100_000), st.integers(1, 100_000)).map(lambda size: _png(1, 1, declared=size)),
)


@settings(max_examples=30, **FUZZ)
@given(
    labels=st.lists(st.integers(-(2**62), 2**62) | st.integers(0, 3), min_size=1, max_size=6),
    images=st.lists(IMAGES, min_size=1, max_size=6),
)
# always tried: decodable images under a label that would make two billion classes
# (the random draws pair big labels with images that are refused first)
@example(labels=[2_000_000_000, 0], images=[_png(6, 6), _png(6, 6)])
def test_data_tables_load_or_say_why_quickly(labels, images):
    count = min(len(labels), len(images))
    with tempfile.TemporaryDirectory() as folder:
        for name in ("train.parquet", "test.parquet"):
            table = pa.table({"image": pa.array(images[:count], type=pa.binary()), "label": pa.array(labels[:count], type=pa.int64())})
            pq.write_table(table, Path(folder) / name)
        tracemalloc.start()
        started = time.process_time()
        try:
            load_dataset(DatasetConfig(name="parquet_images", path=folder), 0)
        except ScenarioError:
            pass
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert time.process_time() - started < CPU_SECONDS and peak < PEAK_BYTES
