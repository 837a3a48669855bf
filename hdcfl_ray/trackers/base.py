"""What every tracker gets: the run's context (scenario, parameters, folder, the
tables to upload) and the three calls it answers."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from hdcfl_ray.plain_text import plain_text

if TYPE_CHECKING:
    from hdcfl_ray.config.schema import Scenario

# RUN_DIR/trackers.json: what a resumed run needs to continue the same tracker runs (MLflow and W&B run ids)
STATE_FILE = "trackers.json"
RUN_FILES = ("scenario.yaml", "manifest.json")
TABLES = ("rounds", "clients", "refresh", "updates", "events")


class Tracker(Protocol):
    def start(self, context: "TrackerContext") -> None: ...

    def log_round(self, step: int, metrics: dict[str, float]) -> None: ...

    def finish(self, status: str) -> None:
        """status: completed, or failed (the run raised); upload the run's files."""
        ...


@dataclass
class TrackerContext:
    scenario: "Scenario"
    run_dir: Path
    # the run's own state of each tracker, kept in RUN_DIR/trackers.json (read at a resume)
    state: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def create(cls, scenario: "Scenario", run_dir: Path) -> "TrackerContext":
        state: dict[str, dict[str, Any]] = {}
        path = run_dir / STATE_FILE
        if path.is_file():  # a resumed run: continue its tracker runs
            try:
                loaded = json.loads(path.read_text())
                state = {key: value for key, value in loaded.items() if isinstance(value, dict)} if isinstance(loaded, dict) else {}
            except (OSError, ValueError):
                state = {}
        return cls(scenario, run_dir, state)

    @property
    def resumed(self) -> bool:
        return bool(self.state)

    @property
    def run_name(self) -> str:
        return plain_text(self.run_dir.resolve().name)

    def scenario_dict(self) -> dict[str, Any]:
        """The resolved scenario without the sections of methods this run does not use,
        its text as plain text (a tracker's web page or terminal would act on control codes)."""
        raw = self.scenario.model_dump(mode="json")
        algorithm = raw.get("algorithm", {})
        raw["algorithm"] = {key: value for key, value in algorithm.items() if key in ("name", algorithm.get("name"))}
        return _plain_values(raw)

    def parameters(self) -> dict[str, str]:
        """The scenario as flat `section.key` -> text (lists as JSON)."""
        flat: dict[str, str] = {}

        def visit(value: Any, prefix: str) -> None:
            if isinstance(value, dict):
                for key, item in value.items():
                    visit(item, f"{prefix}.{key}" if prefix else str(key))
            else:
                flat[prefix] = value if isinstance(value, str) else json.dumps(value)

        visit(self.scenario_dict(), "")
        return flat

    def files(self) -> list[tuple[Path, str]]:
        """(path, name) of what a tracker uploads at the end: scenario.yaml, manifest.json
        and each table's dataset directory (tables/<table>.parquet)."""
        found = [(self.run_dir / name, name) for name in RUN_FILES if (self.run_dir / name).is_file()]
        for table in TABLES:
            directory = self.run_dir / f"{table}.parquet"
            if directory.is_dir():
                found.append((directory, f"tables/{table}.parquet"))
        return found

    def tags(self) -> dict[str, str]:
        return {
            "hdcfl_ray.run_dir": plain_text(str(self.run_dir.resolve())),
            "hdcfl_ray.setting": self.scenario.name,
            "hdcfl_ray.algorithm": self.scenario.algorithm.name,
            "hdcfl_ray.seed": str(self.scenario.seed),
        }


def _plain_values(value: Any) -> Any:
    """`value` (the scenario as JSON data) with every key and text in it plain text."""
    if isinstance(value, str):
        return plain_text(value)
    if isinstance(value, dict):
        return {plain_text(str(key)): _plain_values(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain_values(item) for item in value]
    return value
