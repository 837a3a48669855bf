"""output.trackers: each tracker, read back with its own library (offline, no network),
holds every round's metrics exactly as rounds.parquet has them; a failing tracker is
reported once and the run and its tables go on."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import hdcfl_ray
from cli import app
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.trackers import TRACKERS, round_metrics
from tests.conftest import tiny_scenario


def tracked_run(tmp_path: Path, trackers: list[str], **output) -> hdcfl_ray.Run:
    scenario = tiny_scenario(
        runtime={"backend": "local", "num_cpus": 1},
        protocol={"rounds": 3},
        output={"dir": str(tmp_path / "runs"), "trackers": trackers, **output},
    )
    return hdcfl_ray.simulate(scenario, out=tmp_path / "runs" / "run", progress=False)


def logged_rounds(run_dir: Path, column: str) -> dict[int, float]:
    table = pq.read_table(run_dir / "rounds.parquet").to_pydict()
    return {step: value for step, value in zip(table["round"], table[column]) if value is not None}


def test_tensorboard_events_hold_every_rounds_metrics(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    run = tracked_run(tmp_path, ["tensorboard"])
    events = EventAccumulator(str(run.dir / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    for column in ("mean_accuracy", "worst_accuracy", "bottom20_accuracy", "mean_accuracy_global", "num_groups"):
        read = {event.step: float(tensor_util.make_ndarray(event.tensor_proto)) for event in events.Tensors(column)}
        assert read == logged_rounds(run.dir, column), column
    assert "refresh/silhouette" in events.Tags()["tensors"]  # HDC-FL's refresh rows
    assert not run.notices


def test_mlflow_store_holds_the_scenario_every_round_and_the_tables(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from hdcfl_ray.trackers.mlflow import default_uri

    run = tracked_run(tmp_path, ["mlflow"])
    assert not run.notices
    client = MlflowClient(tracking_uri=default_uri(tmp_path / "runs")[0])
    experiment = client.get_experiment_by_name("tiny")
    [found] = client.search_runs([experiment.experiment_id])
    assert found.info.status == "FINISHED" and found.info.run_name == "run"
    assert found.data.params["seed"] == "7" and found.data.params["algorithm.name"] == "hdcfl"
    assert found.data.params["partition.angles"] == "[0.0, 180.0]"
    for column in ("mean_accuracy", "worst_accuracy", "bottom20_accuracy", "mean_accuracy_global", "ari_true"):
        history = {metric.step: metric.value for metric in client.get_metric_history(found.info.run_id, column)}
        assert history == logged_rounds(run.dir, column), column
    uploaded = {item.path for item in client.list_artifacts(found.info.run_id)}
    assert {"scenario.yaml", "manifest.json", "tables"} <= uploaded
    tables = {item.path for item in client.list_artifacts(found.info.run_id, "tables")}
    assert {"tables/rounds.parquet", "tables/clients.parquet"} <= tables
    assert json.loads((run.dir / "trackers.json").read_text())["mlflow"]["run_id"] == found.info.run_id


def test_wandb_offline_run_holds_the_scenario_and_every_round(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    run = tracked_run(tmp_path, ["wandb"])
    assert not run.notices
    wandb.teardown()  # wait until W&B's service process has written the offline file out
    [offline] = (run.dir / "wandb").glob("offline-run-*/run-*.wandb")  # offline: nothing was sent
    history, config = read_wandb_file(offline)
    for column in ("mean_accuracy", "worst_accuracy", "bottom20_accuracy", "mean_accuracy_global", "num_groups"):
        read = {step: values[column] for step, values in history.items() if column in values}
        assert read == logged_rounds(run.dir, column), column
    assert config["seed"] == 7 and config["algorithm"]["name"] == "hdcfl"


def read_wandb_file(path: Path) -> tuple[dict[int, dict[str, float]], dict]:
    """(step -> metrics, config) of an offline W&B run file: a LevelDB-style log of
    protobuf records (7-byte file header, 32 KiB blocks, records split over blocks)."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, block, position, pieces, records = path.read_bytes(), 32768, 7, b"", []
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a header is padding
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        chunk = data[position + 7 : position + 7 + length]
        position += 7 + length
        pieces = chunk if kind in (1, 2) else pieces + chunk
        if kind in (1, 4):
            records.append(pieces)
    history: dict[int, dict[str, float]] = {}
    config: dict = {}
    for raw in records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            items = {"/".join(item.nested_key) or item.key: json.loads(item.value_json) for item in record.history.item}
            history[int(items["round"])] = items
        elif record.WhichOneof("record_type") == "run":
            config = {item.key: json.loads(item.value_json) for item in record.run.config.update}
    return history, config


class Tracker:
    """A tracker whose round logging breaks (registered over mlflow's name below)."""

    calls: list[str] = []

    def start(self, context) -> None:
        self.calls.append("start")

    def log_round(self, step: int, metrics: dict[str, float]) -> None:
        self.calls.append(f"round {step}")
        raise ConnectionError("the tracking server went away")

    def finish(self, status: str) -> None:
        self.calls.append("finish")


def test_a_failing_tracker_is_reported_once_and_the_run_keeps_its_tables(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(TRACKERS, "mlflow", (__name__, "pyarrow", "mlflow"))
    Tracker.calls = []
    run = tracked_run(tmp_path, ["mlflow"])
    assert Tracker.calls == ["start", "round 1"]  # dropped after its first failure
    assert len(run.notices) == 1 and "the tracking server went away" in run.notices[0]
    assert run.status == "completed" and run.rounds.num_rows == 3 and run.clients.num_rows == 3 * 8
    assert capsys.readouterr().out == ""


def test_a_missing_tracker_package_stops_before_anything_starts(tmp_path, monkeypatch, write_scenario):
    monkeypatch.setitem(TRACKERS, "wandb", ("hdcfl_ray.trackers.wandb", "no_such_package_for_hdcfl", "wandb"))
    with pytest.raises(ScenarioError, match=r'output.trackers: wandb is not installed; pip install -e "\.\[wandb\]"'):
        tracked_run(tmp_path, ["wandb"])
    assert not (tmp_path / "runs" / "run").exists()
    path = write_scenario(tiny_scenario(output={"trackers": ["wandb"]}))
    validated = CliRunner().invoke(app, ["validate", str(path)])  # validate says it too
    assert validated.exit_code == 2 and "wandb is not installed" in validated.output


def test_round_metrics_skip_absent_and_nan_values():
    row = {"round": 2, "mean_accuracy": 0.5, "worst_accuracy": float("nan"), "ari_true": None, "num_groups": 3, "personalized": True}
    assert round_metrics(row, {"silhouette": 0.25, "ari_true": None}) == {
        "mean_accuracy": 0.5,
        "num_groups": 3.0,
        "refresh/silhouette": 0.25,
    }
