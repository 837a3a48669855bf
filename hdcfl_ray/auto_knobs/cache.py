"""Where a run's choice of its auto knobs is kept, so that every run of one setting,
method and seed (a sweep's, a rerun's) chooses once.

A choice belongs to: the setting (`setting_fingerprint`: the resolved scenario
without its name, seed, method, label and the keys a rerun may change), the method
and its section as written (`auto` included), the seed, the candidates of each
knob, the candidates' rounds and held-out share. Its entry is the folder
`<root>/<method>-seed<seed>-<digest>/` holding `choice.json` (the key written out
and the record the runs copy into their manifests) and one run folder per
candidate, `<knob>-<value>/`, as evidence. The root is `<output.dir>/auto-knobs/`
for `hdcfl-ray simulate` and `hdcfl_ray.simulate`, `SWEEP_DIR/auto-knobs/` for a
sweep. Deleting an entry (or the root) makes the next run choose again."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hdcfl_ray.auto_knobs.plan import AutoPlan
from hdcfl_ray.auto_knobs.record import AutoKnobsRecord
from hdcfl_ray.config.schema import Scenario

CACHE_FOLDER = "auto-knobs"  # under output.dir, or a sweep's folder
CHOICE_FILE = "choice.json"
LOCK_FILE = ".lock"
# The way candidates are run and scored; a change to it makes earlier entries miss.
PROCEDURE = 1


def default_root(scenario: Scenario) -> Path:
    return Path(scenario.output.dir) / CACHE_FOLDER


def cache_key(scenario: Scenario, plan: AutoPlan) -> dict[str, Any]:
    """Everything a choice depends on, as plain values."""
    from hdcfl_ray.config.fingerprint import method_knobs, setting_fingerprint

    return {
        "procedure": PROCEDURE,
        "setting": setting_fingerprint(scenario),
        "method": plan.method,
        "section": method_knobs(scenario),
        "seed": scenario.seed,
        "grids": {knob.key: list(knob.candidates) for knob in plan.knobs},
        "rounds": plan.rounds,
        "validation_fraction": plan.validation_fraction,
    }


def entry_dir(root: Path, key: dict[str, Any]) -> Path:
    text = json.dumps(key, sort_keys=True, separators=(",", ":"), default=str)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    return root / f"{key['method']}-seed{key['seed']}-{digest}"


def read_choice(entry: Path, key: dict[str, Any]) -> AutoKnobsRecord | None:
    """The choice kept in `entry` for exactly `key`, or None (none yet, unreadable, or
    made for another key)."""
    path = entry / CHOICE_FILE
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        if document.get("key") != json.loads(json.dumps(key, default=str)):
            return None
        return AutoKnobsRecord.from_dict(document["record"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_choice(entry: Path, key: dict[str, Any], record: AutoKnobsRecord) -> None:
    from hdcfl_ray.durable_files import write_text_durably

    document = {"key": key, "record": record.as_dict()}
    write_text_durably(entry / CHOICE_FILE, json.dumps(document, indent=2, default=str) + "\n")


@contextmanager
def entry_lock(entry: Path, poll_s: float = 0.5) -> Iterator[None]:
    """Hold the entry's lock while its choice is made: a second process or sweep
    thread choosing for the same key waits, then reads the first one's choice."""
    import fcntl

    from hdcfl_ray.runtime.interrupts import raise_if_received

    entry.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(entry / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                raise_if_received()  # a stop signal ends the wait
                time.sleep(poll_s)
        yield
    finally:
        os.close(descriptor)


def cached_choice(scenario: Scenario, plan: AutoPlan, root: Path | None = None) -> tuple[Path, AutoKnobsRecord | None]:
    """The cache entry a run of `scenario` would use, and the choice it holds (None:
    the run will choose)."""
    key = cache_key(scenario, plan)
    entry = entry_dir(root if root is not None else default_root(scenario), key)
    return entry, read_choice(entry, key)
