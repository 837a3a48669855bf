"""Where a run's choice of its auto knobs is kept, so that every run of one setting,
data, code, method and seed (a sweep's, a rerun's) chooses once, and no other run is
served it.

A choice belongs to: the setting (`setting_fingerprint`: the resolved scenario
without its name, seed, method, label and the keys a rerun may change), the data the
candidates saw (a digest of the loaded arrays, not the path they came from: data
regenerated in place gets a new choice), the code that ran them (a digest of the
package's sources, and of a plugin method's module), the method and its section as
written (`auto` included), the seed, the candidates of each knob, the candidates'
rounds and held-out share. Its entry is the folder
`<root>/<method>-seed<seed>-<digest>/` holding `choice.json` (the key written out
and the record the runs copy into their manifests) and one run folder per
candidate, `<knob>-<value>/`, as evidence. A choice with a failed candidate is not
written, so the next run tries again.

The root does not depend on the working directory: `$HDCFL_RAY_CACHE/auto-knobs`,
else `$XDG_CACHE_HOME/hdcfl-ray/auto-knobs`, else `~/.cache/hdcfl-ray/auto-knobs`
for `hdcfl-ray simulate` and `hdcfl_ray.simulate`; `SWEEP_DIR/auto-knobs/` for a
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
from hdcfl_ray.errors import failure_text
from hdcfl_ray.user_cache import CACHE_VARIABLE, user_cache_folder  # noqa: F401  (CACHE_VARIABLE re-exported)

CACHE_FOLDER = "auto-knobs"  # under the user's cache folder, or a sweep's folder
CHOICE_FILE = "choice.json"
LOCK_FILE = ".lock"


def default_root(scenario: Scenario | None = None) -> Path:
    """The user's cache of choices (module docstring), an absolute path."""
    return user_cache_folder(CACHE_FOLDER)


def _method_code(method: str) -> str:
    """A plugin method's own module (the package's sources are in code_digest)."""
    import hashlib
    import inspect
    import sys

    from hdcfl_ray.algorithms.registry import method_spec

    module = sys.modules.get(method_spec(method).build.__module__)
    try:
        source = inspect.getsourcefile(module) if module is not None else None
    except TypeError:
        source = None
    if source is None or Path(source).resolve().is_relative_to(Path(__file__).resolve().parents[1]):
        return ""
    return hashlib.blake2b(Path(source).read_bytes(), digest_size=16).hexdigest()


def cache_key(scenario: Scenario, plan: AutoPlan, data: str | None = None) -> dict[str, Any]:
    """Everything a choice depends on, as plain values; `data` is the digest of the
    loaded dataset (digests.data_digest)."""
    from hdcfl_ray.auto_knobs.digests import code_digest
    from hdcfl_ray.config.fingerprint import method_knobs, setting_fingerprint

    return {
        "code": code_digest(),
        "plugin_code": _method_code(plan.method),
        "data": data,
        "setting": setting_fingerprint(scenario),
        "method": plan.method,
        "section": method_knobs(scenario),
        "seed": scenario.seed,
        "grids": {knob.key: list(knob.candidates) for knob in plan.knobs},
        "rounds": plan.rounds,
        "full_rounds": plan.full_rounds,
        "draws": plan.draws,
        "validation_fraction": plan.validation_fraction,
    }


def choice_code(key: dict[str, Any]) -> str:
    """The code a choice for `key` is made by, as its record keeps it: the package's
    digest, and a plugin method's own after a '+'. Reports keep runs whose choices
    were made by different code apart (analysis/auto_choice.py)."""
    plugin = key.get("plugin_code") or ""
    return f"{key['code']}+{plugin}" if plugin else str(key["code"])


def entry_dir(root: Path, key: dict[str, Any]) -> Path:
    text = json.dumps(key, sort_keys=True, separators=(",", ":"), default=str)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    return root / f"{key['method']}-seed{key['seed']}-{digest}"


def read_choice(entry: Path, key: dict[str, Any]) -> tuple[AutoKnobsRecord | None, str | None]:
    """The choice kept in `entry` for exactly `key`, once checked against its own evidence
    (evidence.py), and None beside it; or no choice, and why the file there is not used
    (None when there is no file: nothing was chosen yet)."""
    from hdcfl_ray.auto_knobs.evidence import record_problems

    path = entry / CHOICE_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, None
    except (OSError, UnicodeDecodeError) as failure:
        return None, f"unreadable ({failure_text(failure)})"
    try:
        document = json.loads(text)
    except ValueError as failure:
        return None, f"not valid JSON ({failure})"
    if not isinstance(document, dict) or not isinstance(document.get("record"), dict):
        return None, "not a choice file (no `record` object)"
    if document.get("key") != json.loads(json.dumps(key, default=str)):
        return None, "its `key` is not the one this entry's folder name was made from (edited, or another setting's)"
    try:
        record = AutoKnobsRecord.from_dict(document["record"])
    except (KeyError, TypeError, ValueError) as failure:
        return None, f"its record is malformed ({failure_text(failure)})"
    problems = record_problems(record, entry)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return None, f"{problems[0]}{more}"
    return record, None


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


def cached_choice(
    scenario: Scenario, plan: AutoPlan, root: Path | None = None, data: str | None = None
) -> tuple[Path, AutoKnobsRecord | None, str | None]:
    """The cache entry a run of `scenario` would use, the choice it holds (None: the run
    will choose), and why a choice file there would not be used (read_choice)."""
    key = cache_key(scenario, plan, data)
    entry = entry_dir(root if root is not None else default_root(scenario), key)
    return (entry, *read_choice(entry, key))


def not_used_notice(entry: Path, problem: str) -> str:
    """What a user is told of a kept choice that failed its checks."""
    return f"auto: the kept choice {entry / CHOICE_FILE} is not used: {problem}; the choice is made again"
