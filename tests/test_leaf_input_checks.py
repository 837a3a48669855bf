"""LEAF's JSON files are input, checked like every input: each malformed file stops
`hdcfl-ray validate` with exit 2 naming the file, the user and the fix; the class count is
the task's (FEMNIST's 62), never the largest label seen; pixels on a 0-255 scale are read
with a warning; users LEAF's sample split would drop are dropped and counted; LEAF's user
split is refused for what it is; and a file is read a user at a time into uint8."""

from __future__ import annotations

import json
import math
import tracemalloc
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from cli import app
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.config.schema import DatasetConfig
from hdcfl_ray.data.sources import leaf_memory
from hdcfl_ray.data.sources.leaf import load_leaf
from hdcfl_ray.data.sources.leaf_samples import FEMNIST_CLASSES
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.models import build_split_model
from hdcfl_ray.runtime.initial_model import initial_parameters
from hdcfl_ray.runtime.preflight import prepare_run
from tests.conftest import tiny_scenario

runner = CliRunner()
USERS = ("f0001_00", "f0002_11", "f0003_22")
SAMPLES = 6
LENGTH = 12  # characters per window in the text files


def femnist_user(count: int, seed: int, labels: list[int] | None = None) -> dict[str, Any]:
    """LEAF's FEMNIST values: 1.0 for the background, k/255 for the strokes."""
    rng = np.random.default_rng(seed)
    pixels = np.where(rng.random((count, 784)) < 0.2, rng.integers(0, 256, (count, 784)) / 255.0, 1.0)
    return {"x": pixels.tolist(), "y": labels if labels is not None else [int(label) for label in rng.integers(0, 10, count)]}


def femnist_document(labels: Callable[[int], list[int]] | None = None) -> dict[str, Any]:
    user_data = {user: femnist_user(SAMPLES, index, labels(index) if labels else None) for index, user in enumerate(USERS)}
    return {"users": list(USERS), "num_samples": [SAMPLES] * len(USERS), "user_data": user_data}


def text_document(length: int = LENGTH) -> dict[str, Any]:
    line = "to be, or not to be, that is the question: whether 'tis nobler in the mind to suffer"
    user_data = {
        user: {"x": [line[i : i + length] for i in range(SAMPLES)], "y": [line[i + length] for i in range(SAMPLES)]}
        for user in USERS
    }
    return {"users": list(USERS), "num_samples": [SAMPLES] * len(USERS), "user_data": user_data}


def write(path: Path, document: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))  # NaN and Infinity written as JSON's parsers read them
    return path


def leaf_scenario(data: Path, num_clients: int = 2, **dataset: Any) -> dict[str, Any]:
    """A tiny FedAvg scenario on LEAF's files, one user per client."""
    scenario = tiny_scenario(algorithm={"name": "fedavg"}, protocol={"rounds": 1, "local_epochs": 1, "batch_size": 4})
    scenario["dataset"] = {"name": "leaf_json", "path": str(data), **dataset}
    scenario["partition"] = {"kind": "natural_id", "partition_by": "users", "num_clients": num_clients, "min_samples": 2}
    if "sequence_length" in dataset:
        scenario["model"] = {"encoder": "char_lstm", "feature_dim": 8}
    return scenario


def validate(tmp_path: Path, data: Path, **dataset: Any) -> Any:
    scenario = leaf_scenario(data, **dataset)
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario, sort_keys=False))
    return runner.invoke(app, ["validate", str(path)])


def refused(tmp_path: Path, data: Path, **dataset: Any) -> str:
    """The CLI's message for a file it must refuse: exit 2, no traceback."""
    result = validate(tmp_path, data, **dataset)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    return " ".join(result.output.split())


def _edit_user(user: str, edit: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    return lambda document: edit(document["user_data"][user])


def _set_pixel(value: float) -> Callable[[dict[str, Any]], None]:
    def edit(data: dict[str, Any]) -> None:
        data["x"][3][100] = value

    return edit


# (what is wrong, the edit, the user the message must name, what it must say)
MALFORMED: list[tuple[str, Callable[[dict[str, Any]], None], str, str]] = [
    ("ragged x", _edit_user(USERS[0], lambda data: data["x"][2].pop()), USERS[0], "rows of different lengths"),
    ("x of 16 pixels", _edit_user(USERS[1], lambda data: data.update(x=[row[:16] for row in data["x"]])), USERS[1], "rows of 16 values"),
    ("a string y", _edit_user(USERS[1], lambda data: data["y"].__setitem__(1, "a")), USERS[1], "y[1] is 'a', not a class number"),
    ("a boolean y", _edit_user(USERS[1], lambda data: data["y"].__setitem__(2, True)), USERS[1], "y[2] is True, not a class number"),
    ("a negative y", _edit_user(USERS[2], lambda data: data["y"].__setitem__(0, -1)), USERS[2], "y[0] is -1, outside FEMNIST's 62 classes"),
    ("a y past the classes", _edit_user(USERS[0], lambda data: data["y"].__setitem__(4, 62)), USERS[0], "y[4] is 62, outside FEMNIST's 62 classes"),
    ("x and y of other lengths", _edit_user(USERS[2], lambda data: data["y"].pop()), USERS[2], "6 samples in x and 5 in y"),
    ("num_samples too high", lambda document: document["num_samples"].__setitem__(1, 7), USERS[1], "num_samples[1] says 7 samples, and x and y hold 6"),
    ("num_samples too low", lambda document: document["num_samples"].__setitem__(0, 5), USERS[0], "num_samples[0] says 5"),
    ("a NaN pixel", _edit_user(USERS[0], _set_pixel(math.nan)), USERS[0], "x[3] holds nan (not finite)"),
    ("an infinite pixel", _edit_user(USERS[0], _set_pixel(math.inf)), USERS[0], "x[3] holds inf (not finite)"),
    ("a null pixel", _edit_user(USERS[0], _set_pixel(None)), USERS[0], "x[3] holds None, not a pixel"),  # type: ignore[arg-type]
    ("a negative pixel", _edit_user(USERS[1], _set_pixel(-0.5)), USERS[1], "x[3] holds the pixel -0.5, outside [0, 1]"),
    ("a pixel past 255", _edit_user(USERS[1], _set_pixel(300.0)), USERS[1], "x[3] holds the pixel 300, outside [0, 1] (LEAF's scale) and outside [0, 255]"),
    ("a string first row", _edit_user(USERS[0], lambda data: data["x"].__setitem__(0, "abc")), USERS[0],
     "x[0] is str, not a list of pixels"),
    ("a user without data", lambda document: document["user_data"].pop(USERS[2]), USERS[2], "has no x and y lists in user_data"),
    ("data of an unlisted user", lambda document: (document["users"].pop(), document["num_samples"].pop()), USERS[2], "has data in user_data but is not in users"),
    ("a user listed twice", lambda document: (document["users"].append(USERS[0]), document["num_samples"].append(SAMPLES)), USERS[0], "is listed twice in users"),
]


@pytest.mark.parametrize("case, edit, user, said", MALFORMED, ids=[case[0] for case in MALFORMED])
def test_each_malformed_femnist_file_exits_2_naming_file_user_and_fix(tmp_path, case, edit, user, said):
    document = femnist_document()
    edit(document)
    data = write(tmp_path / "leaf" / "all_data_0.json", document)
    message = refused(tmp_path, data)
    assert str(data) in message and repr(user) in message and said in message, message
    assert "write the file again" in message or "add them to users" in message, "the fix"


def test_text_windows_of_another_length_exit_2_naming_file_user_and_the_key(tmp_path):
    document = text_document()
    document["user_data"][USERS[1]]["x"][2] = document["user_data"][USERS[1]]["x"][2][:-1]
    data = write(tmp_path / "leaf" / "all_data.json", document)
    message = refused(tmp_path, data, sequence_length=LENGTH)
    assert str(data) in message and repr(USERS[1]) in message
    assert f"x[2] is {LENGTH - 1} characters" in message and "set dataset.sequence_length" in message


def test_text_files_read_with_another_sequence_length_name_it(tmp_path):
    data = write(tmp_path / "leaf" / "all_data.json", text_document())
    message = refused(tmp_path, data, sequence_length=80)
    assert "dataset.sequence_length (80)" in message and str(data) in message and repr(USERS[0]) in message


def test_a_text_y_of_two_characters_exits_2(tmp_path):
    document = text_document()
    document["user_data"][USERS[2]]["y"][0] = "ab"
    data = write(tmp_path / "leaf" / "all_data.json", document)
    message = refused(tmp_path, data, sequence_length=LENGTH)
    assert str(data) in message and repr(USERS[2]) in message and "y[0] is 'ab', not one character" in message


def test_a_femnist_subsample_without_the_high_labels_trains_a_62_way_head(tmp_path):
    """LEAF's labels 0-45 only (no lower case past 'j'): the head is still FEMNIST's 62."""
    data = write(tmp_path / "leaf" / "all_data.json", femnist_document(lambda index: [index * 15 + k for k in range(SAMPLES)]))
    scenario = build_scenario(leaf_scenario(data, num_clients=3))
    prepared = prepare_run(scenario)
    labels = np.concatenate([prepared.dataset.train_labels, prepared.dataset.test_labels])
    assert labels.max() <= 45 < len(FEMNIST_CLASSES) - 1
    assert prepared.dataset.num_classes == 62 and prepared.dataset.classes[:11] == tuple("0123456789A")
    feature_dim = scenario.model.feature_dim
    assert initial_parameters(scenario, prepared.dataset).head.shape == ((feature_dim + 1) * 62,)
    model = build_split_model(scenario.model, in_channels=prepared.dataset.channels, num_classes=prepared.dataset.num_classes, seed=0)
    import torch

    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 62)


def test_text_has_the_vocabularys_classes_whatever_the_labels(tmp_path):
    data = write(tmp_path / "leaf" / "all_data.json", text_document())
    dataset = load_leaf(DatasetConfig(name="leaf_json", path=str(data), sequence_length=LENGTH), 0, "users")
    assert dataset.text and dataset.num_classes == 81
    assert dataset.train_images.dtype == np.uint8 and dataset.train_images.shape[1:] == (LENGTH, 1, 1)


def test_pixels_on_a_0_255_scale_are_rescaled_with_a_warning_naming_the_file(tmp_path):
    document = femnist_document()
    scaled = json.loads(json.dumps(document))
    for data in scaled["user_data"].values():
        data["x"] = [[round(value * 255) for value in row] for row in data["x"]]
    unit = load_leaf(DatasetConfig(name="leaf_json", path=str(write(tmp_path / "unit.json", document))), 0, "users")
    path = write(tmp_path / "leaf" / "all_data.json", scaled)
    bytes_scale = load_leaf(DatasetConfig(name="leaf_json", path=str(path)), 0, "users")
    assert np.array_equal(unit.train_images, bytes_scale.train_images) and np.array_equal(unit.test_images, bytes_scale.test_images)
    assert any(str(path) in notice and "0-255 scale" in notice and "3 of its 3 users" in notice for notice in bytes_scale.notices)
    result = validate(tmp_path, path)
    output = " ".join(result.output.split())
    assert result.exit_code == 0, output
    assert "warning:" in output and str(path) in output and "value / 255" in output


def test_pixels_are_read_into_uint8_exactly_as_leaf_scales_them(tmp_path):
    document = femnist_document()
    dataset = load_leaf(DatasetConfig(name="leaf_json", path=str(write(tmp_path / "a.json", document))), 0, None)
    assert dataset.train_images.dtype == np.uint8 and dataset.train_images.shape[1:] == (28, 28, 1)
    every = np.concatenate([np.asarray(data["x"]) for data in document["user_data"].values()])
    expected = np.sort(np.rint(every * 255.0).astype(np.uint8).reshape(-1, 784), axis=0)
    read = np.concatenate([dataset.train_images, dataset.test_images]).reshape(-1, 784)
    assert np.array_equal(np.sort(read, axis=0), expected)


def test_a_file_is_read_a_user_at_a_time_not_as_python_floats(tmp_path):
    """Python floats of every pixel take about 32 bytes each (8 times the file); a user at
    a time, the read needs the file's text (twice while it decodes) and one user's floats."""
    users = {f"w{index:03d}": femnist_user(50, index) for index in range(12)}
    path = write(tmp_path / "big.json", {"users": list(users), "num_samples": [50] * 12, "user_data": users})
    del users
    tracemalloc.start()
    try:
        dataset = load_leaf(DatasetConfig(name="leaf_json", path=str(path)), 0, "users")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert dataset.train_labels.shape[0] + dataset.test_labels.shape[0] == 600
    assert peak < 2.6 * path.stat().st_size, f"peak {peak / 2**20:.1f} MB for a {path.stat().st_size / 2**20:.1f} MB file"


def test_users_below_leafs_floor_are_left_out_and_counted(tmp_path):
    document = femnist_document()
    document["users"] += ["lonely", "empty"]
    document["num_samples"] += [1, 0]
    document["user_data"]["lonely"] = femnist_user(1, 9)
    document["user_data"]["empty"] = {"x": [], "y": []}
    data = write(tmp_path / "leaf" / "all_data.json", document)
    dataset = load_leaf(DatasetConfig(name="leaf_json", path=str(data)), 0, "users")
    assert dataset.id_names == USERS
    assert any("left out 2 of 5 users with fewer than 2 samples (1 samples in all)" in notice for notice in dataset.notices)


def _sample_split(folder: Path, train_users: tuple[str, ...], test_users: tuple[str, ...]) -> Path:
    for split, users in (("train", train_users), ("test", test_users)):
        user_data = {user: femnist_user(4, index) for index, user in enumerate(users)}
        write(folder / split / f"all_data_0_{split}.json", {"users": list(users), "num_samples": [4] * len(users), "user_data": user_data})
    return folder


def test_leafs_sample_split_reads_each_user_in_both_folders(tmp_path):
    folder = _sample_split(tmp_path / "data", USERS, USERS)
    dataset = load_leaf(DatasetConfig(name="leaf_json", path=str(folder)), 0, "users")
    assert dataset.id_names == USERS and set(dataset.test_ids.tolist()) == {0, 1, 2}


def test_leafs_user_split_is_refused_naming_it_and_what_works(tmp_path):
    folder = _sample_split(tmp_path / "data", USERS[:2], ("f0009_01", "f0010_02"))
    message = refused(tmp_path, folder)
    assert "LEAF's user split (preprocess.sh -t user)" in message and "-t sample" in message
    assert "'f0009_01'" in message and str(folder / "test" / "all_data_0_test.json") in message
    assert "test_split" not in message, "no key that does nothing for LEAF's files"


def test_the_user_split_pools_its_test_users_when_the_clients_are_not_users(tmp_path):
    """Without partition_by, the test split is a pool every client draws its test set from."""
    folder = _sample_split(tmp_path / "data", USERS[:2], ("f0009_01",))
    dataset = load_leaf(DatasetConfig(name="leaf_json", path=str(folder)), 0, None)
    assert dataset.train_labels.shape == (8,) and dataset.test_labels.shape == (4,) and not dataset.has_ids


def test_a_user_in_one_folder_only_is_refused(tmp_path):
    folder = _sample_split(tmp_path / "data", USERS, USERS[:2])
    message = refused(tmp_path, folder)
    assert f"user {USERS[2]!r}" in message and "is in train/ and not in test/" in message
    assert str(folder / "train" / "all_data_0_train.json") in message


def test_a_train_user_below_the_floor_is_dropped_not_refused(tmp_path):
    folder = _sample_split(tmp_path / "data", USERS, USERS[:2])
    path = folder / "train" / "all_data_0_train.json"
    document = json.loads(path.read_text())
    document["user_data"][USERS[2]] = femnist_user(1, 5)
    document["num_samples"][2] = 1
    path.write_text(json.dumps(document))
    dataset = load_leaf(DatasetConfig(name="leaf_json", path=str(folder)), 0, "users")
    assert dataset.id_names == USERS[:2] and "left out 1 of 3 users" in dataset.notices[0]


def test_keys_in_any_order_and_json_errors_with_their_position(tmp_path):
    document = femnist_document()
    reordered = {"user_data": document["user_data"], "num_samples": document["num_samples"], "users": document["users"]}
    dataset = load_leaf(DatasetConfig(name="leaf_json", path=str(write(tmp_path / "a.json", reordered))), 0, "users")
    assert dataset.id_names == USERS
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(document)[:-30])
    with pytest.raises(ScenarioError, match="is not readable JSON .*line 1 column"):
        load_leaf(DatasetConfig(name="leaf_json", path=str(broken)), 0, "users")
    twice = tmp_path / "twice.json"
    twice.write_text(json.dumps(document)[:-2] + ', "f0001_00": {"x": [], "y": []}}}')
    with pytest.raises(ScenarioError, match="user 'f0001_00' appears twice in user_data"):
        load_leaf(DatasetConfig(name="leaf_json", path=str(twice)), 0, "users")
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(ScenarioError, match="not a LEAF data file"):
        load_leaf(DatasetConfig(name="leaf_json", path=str(listed)), 0, "users")


def test_a_large_read_says_what_it_will_take_first(tmp_path, monkeypatch, capsys):
    data = write(tmp_path / "all_data.json", femnist_document())
    monkeypatch.setattr(leaf_memory, "ANNOUNCE_FROM_BYTES", 0)
    load_leaf(DatasetConfig(name="leaf_json", path=str(data)), 0, "users")
    said = capsys.readouterr().err
    assert "reading LEAF's JSON: 1 file," in said and "of memory at the peak of the read" in said


def test_a_read_past_this_machines_memory_is_refused_before_it_starts(tmp_path, monkeypatch):
    data = write(tmp_path / "all_data.json", femnist_document())
    monkeypatch.setattr(leaf_memory, "machine_memory_bytes", lambda: 2**16)
    with pytest.raises(ScenarioError, match="of memory at the peak of the read, more than this machine's"):
        load_leaf(DatasetConfig(name="leaf_json", path=str(data)), 0, "users")


def test_the_estimate_of_what_is_kept_follows_leafs_number_format(tmp_path):
    data = write(tmp_path / "all_data.json", femnist_document())
    estimate = leaf_memory.estimate_read([data])
    kept = len(USERS) * SAMPLES * 784
    assert 0.8 * kept < estimate.kept_bytes < 1.25 * kept
