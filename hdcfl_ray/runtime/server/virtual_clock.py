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

from hdcfl_ray import seeding
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
    rng = seeding.rng(seed, "clock")
    speeds = draw(system.speed, num_clients, rng)
    delays = draw(system.delay, num_clients, rng)
    profiles = [ClientProfile(speed=float(s), delay=float(d)) for s, d in zip(speeds, delays)]
    if system.trace is not None:
        profiles = _apply_trace(profiles, Path(system.trace))
    for client_id, profile in enumerate(profiles):
        if not profile.speed > 0:
            raise ScenarioError(f"protocol.system: client {client_id} has speed {profile.speed}; speeds must be > 0")
    return profiles


TRACE_KEY = "protocol.system.trace"
TRACE_COLUMNS = ("client_id", "speed", "delay", "available_from", "available_until")
REQUIRED_TRACE_COLUMNS = ("client_id", "speed", "delay")


def read_trace(path: Path) -> pa.Table:
    if not path.is_file():
        raise ScenarioError(f"{TRACE_KEY}: {path} does not exist (a CSV or Parquet file with client_id, speed, delay)")
    if path.suffix != ".parquet":
        # Arrow reads undecodable header bytes and fails only when the names are asked for
        try:
            path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ScenarioError(
                f"{TRACE_KEY}: {path} is not a text file (byte {exc.start} is not UTF-8); a trace is a CSV text file or a .parquet file"
            ) from None
        except OSError as exc:
            raise ScenarioError(f"{TRACE_KEY}: {path} cannot be read ({exc.strerror or exc})") from None
    try:
        table = pq.read_table(path) if path.suffix == ".parquet" else pacsv.read_csv(path)
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ScenarioError(f"{TRACE_KEY}: {path} is not a readable CSV or Parquet file: {reason}") from None
    missing = [column for column in REQUIRED_TRACE_COLUMNS if column not in table.column_names]
    if missing:
        raise ScenarioError(
            f"{TRACE_KEY}: {path} lacks the column(s) {', '.join(missing)} "
            f"(has {', '.join(map(str, table.column_names))})"
        )
    unknown = [column for column in table.column_names if column not in TRACE_COLUMNS]
    if unknown:  # a misspelt optional column would otherwise be ignored without a word
        raise ScenarioError(
            f"{TRACE_KEY}: {path} has the unknown column(s) {', '.join(map(str, unknown))}; "
            f"allowed: {', '.join(TRACE_COLUMNS)}"
        )
    return table


def read_trace_profiles(path: Path, num_clients: int) -> dict[int, ClientProfile]:
    """The profiles a trace file gives, by client id; every value checked (numeric,
    finite, in range) and every client listed at most once."""
    is_csv = path.suffix != ".parquet"
    profiles: dict[int, ClientProfile] = {}
    first_seen: dict[int, str] = {}
    for index, row in enumerate(read_trace(path).to_pylist()):
        position = f"line {index + 2}" if is_csv else f"row {index + 1}"  # CSV line 1 is the header
        where = f"{TRACE_KEY}: {path} {position}"
        client_id = _whole_number(row["client_id"])
        if isinstance(client_id, bool) or not isinstance(client_id, int):
            shown = "empty" if client_id is None else repr(client_id)
            raise ScenarioError(f"{where}: client_id is {shown}; give an integer client id in 0..{num_clients - 1}")
        if not 0 <= client_id < num_clients:
            raise ScenarioError(f"{where}: client_id {client_id} is not in 0..{num_clients - 1} (partition.num_clients = {num_clients})")
        if client_id in profiles:
            raise ScenarioError(f"{where}: client_id {client_id} is listed again (first on {first_seen[client_id]}); give each client one row")
        speed = _trace_number(row["speed"], where, "speed", "samples per virtual second, > 0")
        delay = _trace_number(row["delay"], where, "delay", "virtual seconds, >= 0")
        available_from = _trace_number(row.get("available_from"), where, "available_from", "virtual seconds, >= 0", default=0.0)
        available_until = _trace_number(
            row.get("available_until"), where, "available_until", "virtual seconds, or empty for never", default=math.inf, allow_inf=True
        )
        if not speed > 0:
            raise ScenarioError(f"{where}: speed {speed} must be > 0 samples per virtual second")
        if delay < 0 or available_from < 0:
            column, value = ("delay", delay) if delay < 0 else ("available_from", available_from)
            raise ScenarioError(f"{where}: {column} {value} must be >= 0 virtual seconds")
        if not available_until > available_from:
            raise ScenarioError(f"{where}: available_until {available_until} must be later than available_from {available_from}")
        profiles[client_id] = ClientProfile(speed=speed, delay=delay, available_from=available_from, available_until=available_until)
        first_seen[client_id] = position
    return profiles


def check_trace(system: SystemConfig, num_clients: int) -> list[str]:
    """Check the trace file (if any) before a run starts; notices say what the reader
    might not expect: clients the trace leaves out keep their drawn profile."""
    if system.trace is None:
        return []
    listed = read_trace_profiles(Path(system.trace), num_clients)
    left_out = num_clients - len(listed)
    if left_out == 0:
        return []
    return [
        f"{TRACE_KEY}: {system.trace} lists {len(listed)} of {num_clients} clients; the other {left_out} draw "
        f"speed and delay from protocol.system.speed and protocol.system.delay"
    ]


def _whole_number(value: object) -> object:
    """A client id as an int when it is one in another type (a float column, or a text
    column made so by a bad cell elsewhere); anything else unchanged, for the message."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return value


def _trace_number(value: object, where: str, column: str, unit: str, default: float | None = None, allow_inf: bool = False) -> float:
    if value is None and default is not None:
        return default
    if value is None:
        raise ScenarioError(f"{where}: {column} is empty (or NA/NaN); give a number ({unit})")
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ScenarioError(f"{where}: {column} {value!r} is not a number ({unit})")
    try:
        number = float(value)
    except ValueError:
        raise ScenarioError(f"{where}: {column} {value!r} is not a number ({unit})") from None
    if math.isnan(number) or (math.isinf(number) and not (allow_inf and number > 0)):
        raise ScenarioError(f"{where}: {column} is {value!r}; give a finite number ({unit})")
    return number


def _apply_trace(profiles: list[ClientProfile], path: Path) -> list[ClientProfile]:
    updated = list(profiles)
    for client_id, profile in read_trace_profiles(path, len(profiles)).items():
        updated[client_id] = profile
    return updated
