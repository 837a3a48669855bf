"""Ids are data, checked like labels: a null, NaN or empty id in the column of who made each
sample stops the load (exit 2) naming the column, where it is and how many rows, in every
source that reads ids; `dataset.missing_ids: drop` leaves those rows out and says how many.
`partition.partition_by` naming the label column (one class per client) is said, not hidden."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from cli import app
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.config.pinned_knobs import data_setting_keys
from hdcfl_ray.config.schema import DatasetConfig, PartitionConfig
from hdcfl_ray.data.partitions.checks import id_column_notices
from hdcfl_ray.data.sources import load_dataset
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.runtime.preflight import prepare_run
from tests.conftest import tiny_scenario

WRITERS = ("ana", "ben", "cai", "dee")
PER_WRITER = 6
# the ids no one made: two nulls, an empty text and one of only whitespace
UNNAMED: tuple[object, ...] = (None, "", None, "  ")
SIDE = 16


def _png(seed: int) -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (SIDE, SIDE), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode="L").save(buffer, format="PNG")
    return buffer.getvalue()


def _image_table(ids: list[object], offset: int = 0) -> pa.Table:
    """One PNG, a label (0..3) and the given id per row."""
    rows = range(len(ids))
    return pa.table(
        {"image": [_png(offset + row) for row in rows], "label": [row % 4 for row in rows], "writer_id": pa.array(ids, pa.string())}
    )


def _named_ids() -> list[object]:
    return [writer for writer in WRITERS for _ in range(PER_WRITER)]


def _with_unnamed(named: list[object]) -> list[object]:
    """`named` with the unnamed ids spread among them (the first at row 3)."""
    mixed = list(named)
    for position, value in zip((3, 9, 14, 20), UNNAMED):
        mixed.insert(position, value)
    return mixed


def _refusal(config: DatasetConfig, id_column: str) -> str:
    with pytest.raises(ScenarioError) as caught:
        load_dataset(config, 0, id_column)
    return str(caught.value)


def _assert_names_column_and_count(message: str, column: str, counted: str) -> None:
    assert message.startswith("partition.partition_by:"), message
    assert f"column {column!r}" in message and counted in message, message
    assert "dataset.missing_ids: drop" in message, "the message names the option that leaves the rows out"


def _assert_no_unnamed_client(dataset: Any) -> None:
    assert not {"None", "nan", "", "  "} & set(dataset.id_names)
    assert set(dataset.id_names) <= set(WRITERS) | {"eve"}


# ---- Hugging Face layouts (huggingface) -----------------------------------------------------------------


@pytest.fixture
def hub_folder(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    pq.write_table(_image_table(_with_unnamed(_named_ids())), tmp_path / "data" / "train-00000-of-00001.parquet")
    return tmp_path


def test_huggingface_null_and_empty_ids_stop_naming_column_split_and_count(hub_folder):
    config = DatasetConfig(name="huggingface", path=str(hub_folder), test_split=None)
    message = _refusal(config, "writer_id")
    _assert_names_column_and_count(message, "writer_id", "4 of 28 rows (2 null, 2 empty; the first is row 3)")
    assert "split 'train'" in message and "train-00000-of-00001.parquet" in message


def test_huggingface_drop_leaves_the_rows_out_and_says_how_many(hub_folder):
    config = DatasetConfig(name="huggingface", path=str(hub_folder), test_split=None, missing_ids="drop")
    dataset = load_dataset(config, 0, "writer_id")
    assert dataset.train_labels.shape[0] + dataset.test_labels.shape[0] == len(WRITERS) * PER_WRITER
    _assert_no_unnamed_client(dataset)
    assert dataset.id_names == WRITERS
    assert len(dataset.notices) == 1 and "left out the 4 of 28 rows" in dataset.notices[0] and "'writer_id'" in dataset.notices[0]


def test_ids_are_not_checked_when_no_column_is_read(hub_folder):
    dataset = load_dataset(DatasetConfig(name="huggingface", path=str(hub_folder), test_split=None), 0)
    assert dataset.train_labels.shape[0] + dataset.test_labels.shape[0] == 28 and dataset.notices == ()


# ---- a train and a test table (parquet_images) ------------------------------------------------------


def test_parquet_images_ids_checked_in_each_table(tmp_path):
    pq.write_table(_image_table(_named_ids()), tmp_path / "train.parquet")
    pq.write_table(_image_table([*WRITERS, None, "", *WRITERS], offset=100), tmp_path / "test.parquet")
    message = _refusal(DatasetConfig(name="parquet_images", path=str(tmp_path)), "writer_id")
    _assert_names_column_and_count(message, "writer_id", "2 of 10 rows (1 null, 1 empty; the first is row 4)")
    assert str(tmp_path / "test.parquet") in message

    dataset = load_dataset(DatasetConfig(name="parquet_images", path=str(tmp_path), missing_ids="drop"), 0, "writer_id")
    assert dataset.test_labels.shape[0] == 8 and dataset.id_names == WRITERS
    assert dataset.notices == (
        f"dataset.missing_ids: drop: left out the 2 of 10 rows (1 null, 1 empty; the first is row 4) of "
        f"{tmp_path / 'test.parquet'} that have no id in column 'writer_id'",
    )


def test_a_nan_id_is_missing_too(tmp_path):
    ids = [float(index % 4) for index in range(24)]
    ids[5] = float("nan")
    table = _image_table([None] * 24).set_column(2, "writer_id", pa.array(ids, pa.float64()))
    pq.write_table(table, tmp_path / "train.parquet")
    pq.write_table(table, tmp_path / "test.parquet")
    message = _refusal(DatasetConfig(name="parquet_images", path=str(tmp_path)), "writer_id")
    _assert_names_column_and_count(message, "writer_id", "1 of 24 rows (1 null; the first is row 5)")


def test_a_column_of_only_missing_ids_asks_for_the_right_column(tmp_path):
    pq.write_table(_image_table([None] * 8), tmp_path / "train.parquet")
    pq.write_table(_image_table([None] * 8), tmp_path / "test.parquet")
    message = _refusal(DatasetConfig(name="parquet_images", path=str(tmp_path), missing_ids="drop"), "writer_id")
    assert "8 of 8 rows" in message and "name the column of the writer" in message


# ---- text (text) --------------------------------------------------------------------------------------


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    lines = [f"{name} speaks a line of the play, long enough for windows." for name in ("ROMEO", "JULIET", "NURSE")]
    speakers = ["ROMEO", None, "JULIET", "", "NURSE", " "]
    texts = [lines[0], lines[1], lines[1], lines[2], lines[2], lines[0]]
    path = tmp_path / "lines.parquet"
    pq.write_table(pa.table({"speaker": pa.array(speakers, pa.string()), "text": texts}), path)
    return path


def test_text_null_and_empty_speakers_stop(text_file):
    config = DatasetConfig(name="text", path=str(text_file), test_split=None, sequence_length=8)
    message = _refusal(config, "speaker")
    _assert_names_column_and_count(message, "speaker", "3 of 6 rows (1 null, 2 empty; the first is row 1)")
    assert str(text_file) in message and "(train)" in message


def test_text_drop_cuts_no_window_from_rows_without_a_speaker(text_file):
    config = DatasetConfig(name="text", path=str(text_file), test_split=None, sequence_length=8, missing_ids="drop")
    dataset = load_dataset(config, 0, "speaker")
    assert dataset.id_names == ("JULIET", "NURSE", "ROMEO")
    line = len("ROMEO speaks a line of the play, long enough for windows.")
    windows_per_line = len(range(0, line - 8, 8))
    assert dataset.train_labels.shape[0] + dataset.test_labels.shape[0] == 3 * windows_per_line
    assert "left out the 3 of 6 rows" in dataset.notices[0]


# ---- LEAF's JSON files (leaf_json) --------------------------------------------------------------------


@pytest.fixture
def leaf_file(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)

    def samples(count: int) -> dict[str, list[Any]]:
        return {"x": rng.random((count, 784)).round(3).tolist(), "y": [index % 3 for index in range(count)]}

    users = ["f0001", "", "f0002", None, "f0003"]
    user_data = {"f0001": samples(6), "": samples(5), "f0002": samples(6), "f0003": samples(6)}
    path = tmp_path / "all_data.json"
    path.write_text(json.dumps({"users": users, "num_samples": [6, 5, 6, 0, 6], "user_data": user_data}))
    return path


def test_leaf_unnamed_users_stop(leaf_file):
    message = _refusal(DatasetConfig(name="leaf_json", path=str(leaf_file)), "users")
    _assert_names_column_and_count(message, "users", "2 of 5 users (1 null, 1 empty; the first is user 1)")
    assert str(leaf_file) in message


def test_leaf_drop_leaves_out_unnamed_users_and_their_samples(leaf_file):
    dataset = load_dataset(DatasetConfig(name="leaf_json", path=str(leaf_file), missing_ids="drop"), 0, "users")
    assert dataset.id_names == ("f0001", "f0002", "f0003")
    assert dataset.train_labels.shape[0] + dataset.test_labels.shape[0] == 18
    assert "left out the 2 of 5 users" in dataset.notices[0] and dataset.notices[0].endswith("5 samples in all")


# ---- a plugin source that returns ids -----------------------------------------------------------------

UNNAMED_PLUGIN = """
import numpy as np
from hdcfl_ray.contract.data import Images, SourceSpec


def with_gaps(params, seed):
    labels = np.tile(np.arange(4), 10)
    images = np.zeros((labels.shape[0], 8, 8, 1), dtype=np.uint8)
    authors = np.asarray([f"author{i % 4}" for i in range(labels.shape[0])], dtype=object)
    authors[[2, 7, 11]] = [None, "", float("nan")]
    return Images(images, labels, images[:8].copy(), labels[:8].copy(), num_classes=4, train_ids=authors, test_ids=authors[12:20])


SOURCE = SourceSpec("gappy", "images with some authors missing", with_gaps, num_classes=4)
"""


@pytest.fixture
def unnamed_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from tests.test_plugins import loaded_plugin

    (tmp_path / "hdcfl_test_unnamed_plugin.py").write_text(UNNAMED_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield from loaded_plugin("hdcfl_test_unnamed_plugin", monkeypatch)


def test_a_plugin_source_ids_are_checked_and_dropped_alike(unnamed_plugin):
    message = _refusal(DatasetConfig(name="gappy"), "author")
    _assert_names_column_and_count(message, "author", "3 of 40 rows (2 null, 1 empty; the first is row 2)")
    assert "the plugin source 'gappy' (train)" in message
    dataset = load_dataset(DatasetConfig(name="gappy", missing_ids="drop"), 0, "author")
    assert dataset.train_labels.shape[0] == 37 and dataset.id_names == ("author0", "author1", "author2", "author3")
    assert "left out the 3 of 40 rows" in dataset.notices[0]


# ---- the option in the scenario ----------------------------------------------------------------------


def test_missing_ids_is_error_by_default_and_refuses_other_values():
    assert DatasetConfig().missing_ids == "error"
    with pytest.raises(ValueError, match="missing_ids"):
        DatasetConfig(missing_ids="skip")


def test_drop_is_part_of_the_data_setting():
    written = tiny_scenario(dataset={"name": "digits"})
    assert "dataset.missing_ids" not in data_setting_keys(build_scenario(written)), "the default leaves chosen_for valid"
    dropping = build_scenario({**written, "dataset": {"name": "digits", "missing_ids": "drop"}})
    assert data_setting_keys(dropping)["dataset.missing_ids"] == "drop"


# ---- the command: exit 2 with the message, or a warning with drop ------------------------------------


def _natural_scenario(folder: Path, **partition: Any) -> dict[str, Any]:
    scenario = tiny_scenario(
        dataset={"name": "parquet_images", "path": str(folder)},
        algorithm={"name": "fedavg"},
        protocol={"rounds": 1, "participation": 1.0, "local_epochs": 1, "batch_size": 8},
        runtime={"backend": "local"},
    )
    scenario["partition"] = {"kind": "natural_id", "partition_by": "writer_id", "num_clients": 4, "min_samples": 2, **partition}
    return scenario


@pytest.fixture
def natural_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "writers"
    folder.mkdir()
    pq.write_table(_image_table(_with_unnamed(_named_ids())), folder / "train.parquet")
    pq.write_table(_image_table(list(WRITERS) * 2, offset=100), folder / "test.parquet")
    return folder


def test_validate_exits_2_naming_the_column_and_the_count(write_scenario, natural_folder):
    result = CliRunner().invoke(app, ["validate", str(write_scenario(_natural_scenario(natural_folder)))])
    assert result.exit_code == 2, result.output
    assert "error: partition.partition_by: column 'writer_id'" in result.output
    assert "4 of 28 rows" in result.output and "dataset.missing_ids: drop" in result.output


def test_validate_with_drop_warns_how_many_rows_were_left_out(write_scenario, natural_folder):
    path = write_scenario(_natural_scenario(natural_folder))
    result = CliRunner().invoke(app, ["validate", str(path), "--set", "dataset.missing_ids=drop"])
    assert result.exit_code == 0, result.output
    assert "warning: dataset.missing_ids: drop: left out the 4 of 28 rows" in result.output
    assert "ids (writer_id): 4 in the data" in result.output, "no client 'None' among the ids"


# ---- partition_by naming the label column ------------------------------------------------------------


@pytest.mark.parametrize(
    ("dataset", "partition_by", "key"),
    [
        (DatasetConfig(name="parquet_images", path="x"), "label", "dataset.label_column"),
        (DatasetConfig(name="huggingface", path="x", label_column="character"), "character", "dataset.label_column"),
        (DatasetConfig(name="text", path="x", text_column="x", target_column="y"), "y", "dataset.target_column"),
    ],
)
def test_partition_by_the_label_column_warns_one_class_per_client(dataset, partition_by, key):
    notices = id_column_notices(PartitionConfig(kind="natural_id", partition_by=partition_by), dataset)
    assert len(notices) == 1 and notices[0].startswith(f"partition.partition_by: {partition_by!r} is {key}")
    assert "each client then holds one class" in notices[0] and "label_subset" in notices[0]


def test_partition_by_an_id_column_gives_no_warning():
    dataset = DatasetConfig(name="huggingface", path="x", label_column="character")
    assert id_column_notices(PartitionConfig(kind="natural_id", partition_by="writer_id"), dataset) == []
    assert id_column_notices(PartitionConfig(kind="iid"), dataset) == []


def test_a_run_partitioned_by_its_labels_warns_at_validate(write_scenario, natural_folder):
    scenario = build_scenario(_natural_scenario(natural_folder, partition_by="label"))
    assert any("each client then holds one class" in notice for notice in prepare_run(scenario).notices)
    result = CliRunner().invoke(app, ["validate", str(write_scenario(_natural_scenario(natural_folder, partition_by="label")))])
    assert result.exit_code == 0, result.output
    assert "warning: partition.partition_by: 'label' is dataset.label_column" in result.output
