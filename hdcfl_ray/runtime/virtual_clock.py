"""System heterogeneity on a virtual clock: each client's compute speed, network
delay and availability windows, and the virtual duration of a local update.

Nothing sleeps: durations are computed from the work a client does (local
epochs x training samples), so what counts as a straggler is decided by the
scenario and the seed, never by the machine the simulation runs on."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from hdcfl_ray.config.schema import Distribution, SystemConfig
from hdcfl_ray.errors import ScenarioError


@dataclass(frozen=True)
class ClientProfile:
    speed: float  # samples per virtual second
    delay: float  # virtual seconds of network per update
    available_from: float = 0.0
    available_until: float = math.inf

    def update_duration(self, samples_processed: int) -> float:
        return samples_processed / self.speed + self.delay

    def is_available(self, virtual_time: float) -> bool:
        return self.available_from <= virtual_time < self.available_until


def draw(distribution: Distribution, count: int, rng: np.random.Generator) -> np.ndarray:
    if distribution.kind == "constant":
        return np.full(count, distribution.value, dtype=np.float64)
    if distribution.kind == "uniform":
        return rng.uniform(distribution.low, distribution.high, size=count)
    return np.exp(rng.normal(distribution.mean, distribution.sigma, size=count))


def client_profiles(system: SystemConfig, num_clients: int, seed: int) -> list[ClientProfile]:
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xC10C]))
    speeds = draw(system.speed, num_clients, rng)
    delays = draw(system.delay, num_clients, rng)
    profiles = [ClientProfile(speed=float(s), delay=float(d)) for s, d in zip(speeds, delays)]
    if system.trace is not None:
        profiles = _apply_trace(profiles, Path(system.trace))
    for client_id, profile in enumerate(profiles):
        if not profile.speed > 0:
            raise ScenarioError(f"protocol.system: client {client_id} has speed {profile.speed}; speeds must be > 0")
    return profiles


def read_trace(path: Path) -> pa.Table:
    if not path.is_file():
        raise ScenarioError(f"protocol.system.trace: {path} does not exist (a CSV or Parquet file with client_id, speed, delay)")
    try:
        table = pq.read_table(path) if path.suffix == ".parquet" else pacsv.read_csv(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise ScenarioError(f"protocol.system.trace: {path} is not a readable CSV or Parquet file: {exc}") from exc
    missing = {"client_id", "speed", "delay"} - set(table.column_names)
    if missing:
        raise ScenarioError(
            f"protocol.system.trace: {path} lacks the column(s) {', '.join(sorted(missing))} "
            f"(has {', '.join(table.column_names)})"
        )
    return table


def _apply_trace(profiles: list[ClientProfile], path: Path) -> list[ClientProfile]:
    rows = read_trace(path).to_pylist()
    updated = list(profiles)
    for line, row in enumerate(rows, start=2):
        client_id = row["client_id"]
        if not isinstance(client_id, int) or not 0 <= client_id < len(profiles):
            raise ScenarioError(f"protocol.system.trace: {path} row {line}: client_id {client_id!r} is not in 0..{len(profiles) - 1}")
        updated[client_id] = ClientProfile(
            speed=float(row["speed"]),
            delay=float(row["delay"]),
            available_from=float(row.get("available_from") or 0.0),
            available_until=float(row["available_until"]) if row.get("available_until") is not None else math.inf,
        )
    return updated
