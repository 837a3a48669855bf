"""TensorBoard: event files in RUN_DIR/tensorboard (`tensorboard --logdir runs` shows
every run under that folder). Scalars are written in double precision, so the values
read back are the ones in rounds.parquet."""

from __future__ import annotations

from typing import Any

import yaml

from hdcfl_ray.trackers.base import TrackerContext

LOG_FOLDER = "tensorboard"


class Tracker:
    def __init__(self) -> None:
        self.writer: Any = None
        self.context: TrackerContext | None = None

    def start(self, context: TrackerContext) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.context = context
        self.writer = SummaryWriter(log_dir=str(context.run_dir / LOG_FOLDER))
        if not context.resumed:
            scenario = yaml.safe_dump(context.scenario_dict(), sort_keys=False)
            self.writer.add_text("scenario", "```yaml\n" + scenario + "```", 0)
        context.state.setdefault("tensorboard", {"log_dir": LOG_FOLDER})

    def log_round(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step, new_style=True, double_precision=True)
        self.writer.flush()

    def finish(self, status: str) -> None:
        assert self.context is not None
        # TensorBoard has no artefact store: the events sit beside the tables; say where they are
        files = "\n".join(f"* `{name}`: {path.resolve()}" for path, name in self.context.files())
        self.writer.add_text("run files", f"status: {status}\n\n{files}", 0)
        self.writer.close()
