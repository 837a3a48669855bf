"""Reading a run's trivial references: the manifest's `trivial_references` record
(hdcfl_ray/runtime/trivial_references.py, docs/logs.md), as reference name -> the
summary a method's final round has (mean, worst and bottom-20% accuracy, gap)."""

from __future__ import annotations

import math
from typing import Any

RECORD_KEY = "trivial_references"
# the summaries the report's tables show, under the rounds table's column names
RECORDED_METRICS = ("mean_accuracy", "worst_accuracy", "bottom20_accuracy", "gap")


def recorded_references(manifest: dict[str, Any]) -> dict[str, dict[str, float]] | None:
    """Reference name -> metric -> value (NaN where the record holds none); None for a
    run that recorded no references (logged before the record existed, or whose
    references failed: the record then holds only `error`)."""
    record = manifest.get(RECORD_KEY)
    references = record.get("references") if isinstance(record, dict) else None
    if not isinstance(references, dict) or not references:
        return None
    return {
        str(name): {metric: _number(summary.get(metric)) for metric in RECORDED_METRICS}
        for name, summary in references.items()
        if isinstance(summary, dict)
    }


def _number(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
