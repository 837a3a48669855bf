"""MLflow: one MLflow run per run directory, in the experiment named after the
scenario. Default store: a SQLite file under output.dir (`sqlite:///<output.dir>/mlflow.db`,
artefacts in `<output.dir>/mlartifacts`; `mlflow ui --backend-store-uri sqlite:///runs/mlflow.db`
shows it); `output.mlflow_uri` names another store or a server."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from hdcfl_ray.trackers.base import TrackerContext

MAX_PARAMS_PER_BATCH = 100  # MLflow's limit per log_batch call
MAX_PARAM_LENGTH = 6000


def default_uri(output_dir: str | Path) -> tuple[str, str]:
    """(tracking URI, artefact location) of the store under output.dir."""
    folder = Path(output_dir).resolve()
    return f"sqlite:///{folder / 'mlflow.db'}", (folder / "mlartifacts").as_uri()


class Tracker:
    def __init__(self) -> None:
        self.client: Any = None
        self.run_id: str | None = None
        self.context: TrackerContext | None = None

    def start(self, context: TrackerContext) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        for name in ("mlflow.store.db.utils", "alembic"):  # the store's one-time set-up notices
            if logging.getLogger(name).level == logging.NOTSET:
                logging.getLogger(name).setLevel(logging.WARNING)
        self.context = context
        output = context.scenario.output
        if output.mlflow_uri is not None:
            uri, artifact_location = output.mlflow_uri, None
        else:
            Path(output.dir).mkdir(parents=True, exist_ok=True)
            uri, artifact_location = default_uri(output.dir)
        self.client = MlflowClient(tracking_uri=uri)
        previous = context.state.get("mlflow", {})
        if previous.get("run_id") and previous.get("tracking_uri") == uri:  # a resumed run continues its MLflow run
            self.run_id = str(previous["run_id"])
            self.client.update_run(self.run_id, status="RUNNING")
            return
        experiment = self.client.get_experiment_by_name(context.scenario.name)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self.client.create_experiment(context.scenario.name, artifact_location=artifact_location)
        )
        run = self.client.create_run(experiment_id, run_name=context.run_name, tags=context.tags())
        self.run_id = run.info.run_id
        context.state["mlflow"] = {"tracking_uri": uri, "experiment_id": experiment_id, "run_id": self.run_id}
        params = [Param(key, value[:MAX_PARAM_LENGTH]) for key, value in context.parameters().items()]
        for first in range(0, len(params), MAX_PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[first : first + MAX_PARAMS_PER_BATCH])

    def log_round(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(key, value, stamp, step) for key, value in metrics.items()])

    def finish(self, status: str) -> None:
        assert self.context is not None
        try:
            for path, name in self.context.files():
                if path.is_dir():
                    self.client.log_artifacts(self.run_id, str(path), artifact_path=name)
                else:
                    self.client.log_artifact(self.run_id, str(path), artifact_path=str(Path(name).parent) if "/" in name else None)
        finally:
            self.client.set_terminated(self.run_id, "FINISHED" if status == "completed" else "FAILED")
