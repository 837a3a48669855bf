"""Weights & Biases: offline by default (files in RUN_DIR/wandb, `wandb sync` uploads
them later); set WANDB_MODE=online (and log in) to send the run as it goes.
Project: $WANDB_PROJECT, else hdcfl-ray."""

from __future__ import annotations

import os
import re
from typing import Any

from hdcfl_ray.trackers.base import TrackerContext

DEFAULT_PROJECT = "hdcfl-ray"


class Tracker:
    def __init__(self) -> None:
        self.run: Any = None
        self.context: TrackerContext | None = None

    def start(self, context: TrackerContext) -> None:
        import wandb

        self.context = context
        previous = context.state.get("wandb", {})
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", DEFAULT_PROJECT),
            name=context.run_name,
            group=context.scenario.name,
            config=context.scenario_dict(),
            tags=[context.scenario.algorithm.name, f"seed{context.scenario.seed}"],
            dir=str(context.run_dir),
            mode=os.environ.get("WANDB_MODE", "offline"),
            id=previous.get("id"),
            resume="allow" if previous.get("id") else None,
            reinit="create_new",  # one W&B run per simulation, also for concurrent runs of a sweep
            settings=wandb.Settings(silent=True, console="off"),
        )
        context.state["wandb"] = {"id": self.run.id, "project": self.run.project}

    def log_round(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log({**metrics, "round": step}, step=step)

    def finish(self, status: str) -> None:
        import wandb

        assert self.context is not None
        try:
            artifact = wandb.Artifact(re.sub(r"[^A-Za-z0-9_.-]", "-", self.context.run_name) + "-files", type="run-files")
            for path, name in self.context.files():
                if path.is_dir():
                    artifact.add_dir(str(path), name=name)
                else:
                    artifact.add_file(str(path), name=name)
            self.run.log_artifact(artifact)
        finally:
            self.run.finish(exit_code=0 if status == "completed" else 1)
