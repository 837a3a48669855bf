"""What makes two runs one setting: the resolved scenario, not its name.

Runs are replicates of one setting, to be averaged over their seeds, exactly when
their `setting_keys` are equal: every key of the resolved scenario except

* `seed` (what replicates differ in),
* `name` (a label: reports still keep differently named scenarios apart, and show
  the name, but two runs under one name are one setting only when the rest agrees),
* `algorithm.name` and the method's own section `algorithm.<name>` (a report's rows;
  `method_knobs` gives the section, which tells variants of one method apart),
* `output.label` (names a row) and `output.save_refresh_cache` (what a run keeps on
  disk, not what it computes: a run kept for replays is one more seed of its setting),
* the keys a rerun may change (hdcfl_ray/config/safe_keys.py: where and how a run
  executes, how often it saves itself).

The keys that change the arithmetic (runtime.precision, runtime.torch_threads as the
threads a host trains with, CPU against CUDA, ...; safe_keys.ARITHMETIC_KEYS) are part
of the setting: runs that differ in them do not give the same numbers for a seed, so
they are not replicates of each other, and a rerun may not change them either.
Values a run resolves later (`auto`) are compared as written: `auto` is one setting,
whatever each run chose for it (the manifest records the choice).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from hdcfl_ray.config.safe_keys import comparable, flatten, may_differ
from hdcfl_ray.config.schema import Scenario, method_params

# Keys outside the setting besides the rerun-safe ones and the `algorithm` section.
NOT_SETTING_KEYS = frozenset({"name", "seed", "output.label", "output.save_refresh_cache"})


def is_setting_key(key: str) -> bool:
    """Whether the dotted `key` is part of what makes a setting (module docstring)."""
    return not (key in NOT_SETTING_KEYS or key.startswith("algorithm.") or may_differ(key))


def setting_keys(scenario: Scenario, leave_out: Iterable[str] = ()) -> dict[str, Any]:
    """The setting's keys, flat and in the schema's order ({"partition.kind": "rotation",
    ...}), without `leave_out` (dotted keys a caller compares apart, e.g. a calibrated knob)."""
    left_out = set(leave_out)
    return {key: value for key, value in comparable(scenario).items() if is_setting_key(key) and key not in left_out}


def setting_fingerprint(scenario: Scenario, leave_out: Iterable[str] = ()) -> str:
    """A short stable digest of `setting_keys`: equal exactly when the settings are."""
    return keys_fingerprint(setting_keys(scenario, leave_out))


def keys_fingerprint(keys: dict[str, Any]) -> str:
    text = json.dumps(keys, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def method_knobs(scenario: Scenario) -> dict[str, Any]:
    """The running method's own section `algorithm.<name>`, flat ({"mix": 1.0, "rank": 8});
    {} for a method without settings. A plugin method's needs the plugin loaded."""
    return flatten(method_params(scenario.algorithm).model_dump(mode="json"))


def default_method_knobs(scenario: Scenario) -> dict[str, Any]:
    """The running method's section as its defaults set it ({} without settings)."""
    return flatten(type(method_params(scenario.algorithm))().model_dump(mode="json"))
