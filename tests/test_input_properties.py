"""No input a user can write gives a traceback.

Scenarios mutated at random (wrong types, out-of-range numbers, unknown keys,
deleted keys, random bytes as the scenario, trace, weights or data file, random
`--set` strings) make `validate` and `simulate` exit 0 or 2, never 1, never
with a traceback, and exit 2 names a key or a file. Bounded for CI: a fixed,
derandomized number of examples; `simulate` runs one tiny round in this process.
"""

from __future__ import annotations

import tempfile
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from typer.testing import CliRunner

from cli import app
from hdcfl_ray.config.schema import Scenario

runner = CliRunner()


def _leaf_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys: list[str] = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys += [f"{prefix}{name}", *_leaf_keys(annotation, f"{prefix}{name}.")]
        else:
            keys.append(f"{prefix}{name}")
    return keys


def _choices(model: type[BaseModel]) -> set[str]:
    """Every string a Literal key allows: valid values make valid-but-unusual scenarios."""
    found: set[str] = set()
    for field in model.model_fields.values():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            found |= _choices(annotation)
            continue
        for part in (annotation, *typing.get_args(annotation)):
            if typing.get_origin(part) is typing.Literal:
                found |= {value for value in typing.get_args(part) if isinstance(value, str)}
    return found


# dataset.download is the one key that reaches the network; its errors are tested on their own
KEYS = sorted(key for key in _leaf_keys(Scenario) if key != "dataset.download")
SECTIONS = sorted({key.rsplit(".", 1)[0] for key in KEYS if "." in key})
CHOICES = sorted(_choices(Scenario))
FILE_KEYS = ["model.pretrained", "protocol.system.trace", "dataset.path"]

BASE: dict[str, Any] = {
    "name": "prop",
    "seed": 3,
    "dataset": {"name": "digits"},
    "partition": {"kind": "rotation", "num_clients": 4, "angles": [0, 180], "test_per_client": 10},
    "model": {"encoder": "small_cnn", "width": 4, "feature_dim": 8},
    "algorithm": {"name": "hdcfl", "hdcfl": {"groups": 2, "activation_round": 1, "refresh_every": 1}},
    "protocol": {"rounds": 1, "local_epochs": 1, "batch_size": 64},
    "runtime": {"backend": "local"},
    "checkpoint": {"every": None},
}

# Out-of-range, wrong-typed and boundary values. Values that are valid but make a run
# long (2^31 - 1 k-means restarts) are left to validate, which never trains.
COMMON_VALUES = [-1, 0, 1, 2, 3, -(2**63), 2**31, 2**63, 2**64, 10**30, 0.5, -0.5, 1.5, 1e-9, float("nan"), float("inf"), float("-inf"),
                 "abc", "", "1", "-1", "0.5", None, True, False, [], [1, "x"], {}, {"a": 1}, "${HDCFL_PROPERTY_UNSET}"]
VALIDATE_VALUES = [*COMMON_VALUES, 2**31 - 1, 1e308, -1e308]


# simulate trains what it is given: the large encoders would take minutes on CI's CPUs
SIMULATE_CHOICES = [choice for choice in CHOICES if choice not in ("resnet18_cifar", "mobilenet_v2")]


def values(pool: list[Any], choices: list[str]) -> st.SearchStrategy[Any]:
    return st.one_of(st.sampled_from(pool), st.sampled_from(choices), st.integers(-3, 3), st.text(max_size=8))


def mutations(pool: list[Any], choices: list[str] = CHOICES) -> st.SearchStrategy[tuple]:
    identifier = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)
    return st.one_of(
        st.tuples(st.just("set"), st.sampled_from(KEYS), values(pool, choices)),
        st.tuples(st.just("delete"), st.sampled_from(KEYS)),
        st.tuples(st.just("unknown"), st.sampled_from(["", *SECTIONS]), identifier, values(pool, choices)),
        st.tuples(st.just("file"), st.sampled_from(FILE_KEYS), st.binary(max_size=300)),
        st.tuples(st.just("trace_rows"), st.text(alphabet=st.sampled_from("0123456789,.-eEnaifNA \n"), max_size=60)),
        st.tuples(st.just("override"), st.one_of(st.text(max_size=30), st.builds(lambda key, text: f"{key}={text}", st.sampled_from(KEYS), st.text(max_size=12)))),
        st.tuples(st.just("scenario_bytes"), st.binary(max_size=300)),
    )


def _set(raw: dict[str, Any], key: str, value: Any) -> None:
    node = raw
    *sections, leaf = key.split(".")
    for section in sections:
        child = node.get(section)
        if not isinstance(child, dict):
            child = {}
            node[section] = child
        node = child
    node[leaf] = value


def _delete(raw: dict[str, Any], key: str) -> None:
    node: Any = raw
    *sections, leaf = key.split(".")
    for section in sections:
        node = node.get(section) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(leaf, None)


def write_case(folder: Path, applied: list[tuple]) -> tuple[Path, list[str], list[str]]:
    """The mutated scenario file, its --set arguments, and the names a message may use."""
    raw = yaml.safe_load(yaml.safe_dump(BASE))
    overrides: list[str] = []
    names = [*KEYS, *SECTIONS, "--set", "--out"]
    scenario_bytes: bytes | None = None
    for index, mutation in enumerate(applied):
        kind = mutation[0]
        if kind == "set":
            _set(raw, mutation[1], mutation[2])
        elif kind == "delete":
            _delete(raw, mutation[1])
        elif kind == "unknown":
            key = f"{mutation[1]}.{mutation[2]}" if mutation[1] else mutation[2]
            _set(raw, key, mutation[3])
            names.append(key)
        elif kind == "file":
            path = folder / f"file{index}.bin"
            path.write_bytes(mutation[2])
            _set(raw, mutation[1], str(path))
            if mutation[1] == "dataset.path":
                _set(raw, "dataset.name", "parquet_images" if index % 2 else "image_folder")
            names.append(str(path))
        elif kind == "trace_rows":  # a CSV trace with the right header and random rows
            path = folder / f"trace{index}.csv"
            path.write_text("client_id,speed,delay\n" + mutation[1])
            _set(raw, "protocol.system.trace", str(path))
            names.append(str(path))
        elif kind == "override":
            overrides.append(mutation[1])
            names.append(mutation[1].split("=", 1)[0])
        else:
            scenario_bytes = mutation[1]
    path = folder / "scenario.yaml"
    if scenario_bytes is not None:
        path.write_bytes(scenario_bytes)
    else:
        path.write_text(yaml.safe_dump(raw, sort_keys=False, allow_unicode=True))
    names.append(str(path))
    return path, overrides, [name for name in names if name]


def assert_clean_exit(result: Any, names: list[str]) -> None:
    detail = f"exit {result.exit_code}\n{result.output}\n{result.exception!r}"
    assert result.exit_code in (0, 2), detail
    assert "Traceback" not in result.output, detail
    if result.exit_code == 2:
        assert any(name in result.output for name in names), f"the message names no key or file:\n{detail}"


@pytest.fixture(autouse=True)
def _inside_a_temporary_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Relative paths a mutation writes (output.dir, cache_dir) land in a temporary folder."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HDCFL_PROPERTY_UNSET", raising=False)


PROPERTY_SETTINGS = dict(derandomize=True, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@settings(max_examples=80, **PROPERTY_SETTINGS)
@given(applied=st.lists(mutations(VALIDATE_VALUES), min_size=1, max_size=3))
def test_validate_exits_0_or_2_naming_a_key_or_file(applied: list[tuple]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path, overrides, names = write_case(Path(folder), applied)
        flags = [part for override in overrides for part in ("--set", override)]
        assert_clean_exit(runner.invoke(app, ["validate", str(path), *flags]), names)


@settings(max_examples=12, **PROPERTY_SETTINGS)
@given(applied=st.lists(mutations(COMMON_VALUES, SIMULATE_CHOICES), min_size=1, max_size=2))
def test_simulate_exits_0_or_2_naming_a_key_or_file(applied: list[tuple]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path, overrides, names = write_case(Path(folder), applied)
        # tiny and in this process whatever the mutations said (a Ray start per example is too slow for CI)
        flags = [part for override in [*overrides, "runtime.backend=local", "checkpoint.every=null"] for part in ("--set", override)]
        out = Path(folder) / "run"
        result = runner.invoke(app, ["simulate", str(path), *flags, "--out", str(out), "-q"])
        assert_clean_exit(result, names)
        if result.exit_code == 2:
            assert not out.exists(), "a refused start left a run directory behind"


def test_the_key_list_covers_the_schema() -> None:
    assert {"seed", "protocol.rounds", "runtime.num_gpus_per_actor", "model.pretrained", "protocol.system.trace"} <= set(KEYS)
