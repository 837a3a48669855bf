"""What a run records of the auto knobs it chose: the manifest's `auto_knobs` (and
its checkpoints' record, so `--resume` applies the same values without choosing
again), the cache's choice file, and what `hdcfl-ray report` shows.

    {"method": "pacfl", "rule": "...", "rounds": 8, "full_rounds": 20, "validation_fraction": 0.2,
     "from_cache": false, "cache": "runs/auto-knobs/pacfl-seed5-...", "elapsed_s": 81.2, "samples_trained": 123456,
     "knobs": [{"key": "algorithm.pacfl.threshold", "grid": [0.25, ...], "skipped": {},
                "held": {}, "chosen": 4.0, "samples_trained": 123456,
                "candidates": [{"value": 0.25, "validation_mean_accuracy": 0.93, "samples_trained": 15432,
                                "run_dir": "runs/auto-knobs/pacfl-seed5-.../threshold-0.25"}, ...],
                "finalists": [{"value": 4.0, "draw": 0, "validation_mean_accuracy": 0.95, ...}, ...]}]}

`code` (where recorded) is the digest of the code that made the choice (cache.choice_code):
records from before it have none.

`candidates` are rung 1's shortened runs, one per value; `finalists` the better half's
whole-schedule runs, one per held-out draw (the choice is the best mean over the draws).
`validation_mean_accuracy` is a fraction (null for a candidate that diverged);
`samples_trained` counts local training and any training at evaluation, as the
report's budget does; `held` gives the values the method's other auto knobs had
while this one was chosen."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hdcfl_ray.contract.method import AutoValue

RECORD_KEY = "auto_knobs"  # in manifest.json and in each checkpoint's state.json


@dataclass(frozen=True)
class Candidate:
    value: AutoValue
    validation_mean_accuracy: float  # NaN: the run ended without a score
    samples_trained: int
    run_dir: str  # the candidate's run folder, kept as evidence
    error: str | None = None  # why its run failed (it is then never chosen)
    # the value whose run this one is (the method declared them the same run): not trained again
    same_run_as: AutoValue | None = None
    replayed: bool = False  # scored on a replay of another candidate's saved refreshes, not trained
    draw: int | None = None  # a finalist's draw of the held-out share (None: a rung-1 candidate)

    def as_dict(self) -> dict[str, Any]:
        score = self.validation_mean_accuracy
        document: dict[str, Any] = {
            "value": self.value,
            **({"draw": self.draw} if self.draw is not None else {}),
            "validation_mean_accuracy": None if math.isnan(score) else score,
            "samples_trained": self.samples_trained,
            "run_dir": self.run_dir,
        }
        if self.error is not None:
            document["error"] = self.error
        if self.same_run_as is not None:
            document["same_run_as"] = self.same_run_as
        if self.replayed:
            document["replayed"] = True
        return document

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Candidate":
        score = data.get("validation_mean_accuracy")
        return cls(
            data["value"], math.nan if score is None else float(score), int(data.get("samples_trained") or 0),
            str(data.get("run_dir", "")), data.get("error"), data.get("same_run_as"), bool(data.get("replayed", False)),
            None if data.get("draw") is None else int(data["draw"]),
        )


def means_over_draws(finalists: Iterable[Candidate]) -> dict[AutoValue, float]:
    """{finalist value: its mean validation score over its draws} (NaN when a draw has none):
    what the rule chooses among."""
    scores: dict[AutoValue, list[float]] = {}
    for finalist in finalists:
        scores.setdefault(finalist.value, []).append(finalist.validation_mean_accuracy)
    return {value: math.fsum(values) / len(values) for value, values in scores.items()}


@dataclass(frozen=True)
class KnobChoice:
    key: str  # algorithm.<method>.<field>
    grid: tuple[AutoValue, ...]  # the values tried, in order
    skipped: dict[str, str]  # grid values this run could not use, and why
    held: dict[str, AutoValue]  # the method's other auto knobs while this one was chosen
    candidates: tuple[Candidate, ...]
    chosen: AutoValue
    extended: tuple[AutoValue, ...] = ()  # values tried beyond the grid's edge, where the choice landed on it
    at_edge: str | None = None  # "high" / "low": the choice is the largest / smallest value tried
    finalists: tuple[Candidate, ...] = ()  # rung 2: the better half's whole-schedule runs, one per draw

    @property
    def field(self) -> str:
        return self.key.rsplit(".", 1)[-1]

    @property
    def samples_trained(self) -> int:
        return sum(candidate.samples_trained for candidate in (*self.candidates, *self.finalists))

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "grid": list(self.grid),
            "skipped": dict(self.skipped),
            "held": dict(self.held),
            "chosen": self.chosen,
            "extended": list(self.extended),
            "at_edge": self.at_edge,
            "samples_trained": self.samples_trained,
            "candidates": [candidate.as_dict() for candidate in self.candidates],
            "finalists": [finalist.as_dict() for finalist in self.finalists],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "KnobChoice":
        return cls(
            key=str(data["key"]),
            grid=tuple(data.get("grid") or ()),
            skipped=dict(data.get("skipped") or {}),
            held=dict(data.get("held") or {}),
            candidates=tuple(Candidate.from_dict(item) for item in data.get("candidates") or ()),
            chosen=data["chosen"],
            extended=tuple(data.get("extended") or ()),
            at_edge=data.get("at_edge"),
            finalists=tuple(Candidate.from_dict(item) for item in data.get("finalists") or ()),
        )


@dataclass(frozen=True)
class AutoKnobsRecord:
    method: str
    rule: str
    rounds: int  # each candidate's rounds
    full_rounds: int
    validation_fraction: float
    knobs: tuple[KnobChoice, ...]
    cache: str  # the cache entry's folder
    from_cache: bool  # read from the cache: this run trained no candidate
    elapsed_s: float  # the choosing's wall time when it was made
    # the code that made the choice (cache.choice_code); "" in records made before it was kept
    code: str = ""

    def choices(self) -> dict[str, AutoValue]:
        """{field: chosen value}: what the run's method section gets."""
        return {knob.field: knob.chosen for knob in self.knobs}

    @property
    def samples_trained(self) -> int:
        return sum(knob.samples_trained for knob in self.knobs)

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "rule": self.rule,
            "rounds": self.rounds,
            "full_rounds": self.full_rounds,
            "validation_fraction": self.validation_fraction,
            "from_cache": self.from_cache,
            "cache": self.cache,
            "elapsed_s": self.elapsed_s,
            "samples_trained": self.samples_trained,
            "knobs": [knob.as_dict() for knob in self.knobs],
            **({"code": self.code} if self.code else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "AutoKnobsRecord":
        return cls(
            method=str(data["method"]),
            rule=str(data.get("rule", "")),
            rounds=int(data["rounds"]),
            full_rounds=int(data["full_rounds"]),
            validation_fraction=float(data["validation_fraction"]),
            knobs=tuple(KnobChoice.from_dict(item) for item in data["knobs"]),
            cache=str(data.get("cache", "")),
            from_cache=bool(data.get("from_cache", False)),
            elapsed_s=float(data.get("elapsed_s") or 0.0),
            code=str(data.get("code") or ""),
        )

    def from_the_cache(self) -> "AutoKnobsRecord":
        """This record as a later run that read it from the cache records it."""
        from dataclasses import replace

        return replace(self, from_cache=True)


def recorded_choice(plan: Any, run_dir: Path, manifest: dict[str, Any] | None, checkpoint: dict[str, Any] | None) -> AutoKnobsRecord:
    """The choice a run recorded when it started (its manifest's, else its checkpoint's),
    for `plan`'s knobs: a resume applies it and never chooses again."""
    from hdcfl_ray.errors import ScenarioError

    keys = ", ".join(knob.key for knob in plan.knobs)
    record = find_recorded_choice(plan.method, {knob.field for knob in plan.knobs}, (manifest, checkpoint))
    if record is not None:
        return record
    raise ScenarioError(
        f"--resume {run_dir}: {keys} are auto, and neither the manifest nor a checkpoint records the values this run "
        "chose for them, so its rounds cannot go on with the same ones; start a new run"
    )


def find_recorded_choice(method: str, fields: set[str], documents: Iterable[dict[str, Any] | None]) -> AutoKnobsRecord | None:
    """The first of `documents` (manifests, checkpoint states) whose record chose every one
    of `fields` for `method`; None when none did. A damaged record is passed over: it
    cannot say which values the run used."""
    for document in documents:
        data = (document or {}).get(RECORD_KEY)
        if not isinstance(data, dict):
            continue
        try:
            record = AutoKnobsRecord.from_dict(data)
        except (KeyError, TypeError, ValueError):
            continue
        if record.method == method and fields <= set(record.choices()):
            return record
    return None
