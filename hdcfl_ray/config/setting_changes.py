"""What differs between two scenarios in the keys that change a run's results: the one
diff a resume (`simulate --resume`), a sweep rerun and a report's grouping agree on,
beside the definition of what may differ (safe_keys.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hdcfl_ray.config.safe_keys import comparable, may_differ
from hdcfl_ray.config.schema import Scenario

_ABSENT = object()


@dataclass(frozen=True)
class SettingChange:
    key: str  # dotted path, e.g. protocol.optimizer.lr
    old: Any
    new: Any

    def describe(self) -> str:
        return f"{self.key}: {_show(self.old)} -> {_show(self.new)}"


def setting_changes(on_disk: Scenario, wanted: Scenario) -> list[SettingChange]:
    """The keys whose resolved values differ, except those that may differ on a rerun
    and the sections of methods the run does not use."""
    old = comparable(on_disk)
    new = comparable(wanted)
    changes = []
    for key in sorted(set(old) | set(new)):
        before, after = old.get(key, _ABSENT), new.get(key, _ABSENT)
        if before != after and not may_differ(key):
            changes.append(SettingChange(key, before, after))
    return changes


def _show(value: Any) -> str:
    if value is _ABSENT:
        return "(absent)"
    return json.dumps(value)
