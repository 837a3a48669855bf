"""Which runs are one setting and method at several privacy levels, and which run without
privacy is their "no DP" end (docs/privacy.md).

A report's columns keep every `privacy.*` key apart, so the runs of one setting at
epsilon 1 and at epsilon 4 sit in two columns. Here they are brought back together:

* a *family* is the runs of one scenario name whose setting keys
  (hdcfl_ray/config/fingerprint.py) agree once every `privacy.*` key is removed: the same
  data, model and protocol;
* a *line* is one method of a family at its own knobs (the method's section, compared
  whole) and one *privacy variant*: the privacy keys that say how noise is made and
  accounted (clip, delta, sampling, noise cohort, accountant, ...);
* a *level* is one value of the keys that set how much is spent (`target_epsilon`,
  `noise_multiplier`, `max_epsilon`) on a line, its runs the seeds.

A run without a privacy section joins every line of its family, method and knobs as the
level at epsilon = infinity: the pair differs only in the privacy section. Each level's
epsilon is the one its runs reached by the RDP accountant (the manifest's
`privacy.epsilon_rdp`: the guarantee), not the target they were given."""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from statistics import mean
from typing import Any

from analysis.runs import RunRecord, method_label
from analysis.setting_groups import run_setting
from hdcfl_ray.config.fingerprint import keys_fingerprint

PRIVACY_SECTION = "privacy"
# the privacy keys that set how much a run spends: a level each; the others make a variant
LEVEL_KEYS = ("privacy.target_epsilon", "privacy.noise_multiplier", "privacy.max_epsilon")
# what a level records of each run's final round (fractions; ARI as is; NaN where absent)
FINAL_METRICS = ("mean_accuracy", "worst_accuracy", "ari_true")
NO_DP = math.inf


@dataclass(frozen=True)
class LevelRun:
    """One finished run on a line, at one level."""

    run: RunRecord
    epsilon: float  # reached (RDP); NO_DP without privacy
    values: dict[str, float]  # FINAL_METRICS of the final evaluated round


@dataclass(frozen=True)
class Level:
    """One privacy level of a line: its runs, one per seed."""

    runs: list[LevelRun]
    target_epsilon: float | None  # privacy.target_epsilon as given (None: noise_multiplier, or no DP)

    @property
    def epsilon(self) -> float:
        """The epsilon its runs reached, averaged (equal for every seed unless max_epsilon stopped one early)."""
        return mean(run.epsilon for run in self.runs)

    @property
    def private(self) -> bool:
        return not math.isinf(self.epsilon)

    @property
    def seeds(self) -> list[int]:
        return sorted(run.run.seed for run in self.runs)

    def by_seed(self) -> dict[int, LevelRun]:
        return {run.run.seed: run for run in self.runs}


@dataclass(frozen=True)
class Line:
    """A method of a family at one privacy variant: its private levels by ascending epsilon,
    then the family's run without privacy where there is one."""

    setting: str  # the family's name: the scenario's, with its digest where one name holds several families
    method: str  # the method's row label, with what sets its knobs or privacy variant apart where needed
    levels: list[Level] = field(default_factory=list)
    privacy: dict[str, Any] = field(default_factory=dict)  # the variant's privacy keys (LEVEL_KEYS left out)

    @property
    def private_levels(self) -> list[Level]:
        return [level for level in self.levels if level.private]

    @property
    def no_dp(self) -> Level | None:
        return next((level for level in self.levels if not level.private), None)


def epsilon_reached(run: RunRecord) -> float:
    """The epsilon a run spent by the RDP accountant: the manifest's privacy.epsilon_rdp, else
    its configured accountant's epsilon, else the rounds table's last; NO_DP without a
    privacy record; NaN for a private run that recorded none."""
    record = run.manifest.get(PRIVACY_SECTION)
    if not isinstance(record, dict):
        return NO_DP
    for key in ("epsilon_rdp", "epsilon"):
        if isinstance(record.get(key), (int, float)):
            return float(record[key])
    logged = [row.get("epsilon") for row in run.rounds.to_pylist() if row.get("epsilon") is not None]
    return float(logged[-1]) if logged else math.nan


def final_values(run: RunRecord) -> dict[str, float]:
    final = run.final_evaluated_round() or {}
    return {metric: _number(final.get(metric)) for metric in FINAL_METRICS}


def privacy_lines(runs: list[RunRecord]) -> list[Line]:
    """Every line (module docstring) of the finished `runs` that has at least one private
    level, ordered by setting and method; its run without privacy attached as its last level."""
    finished = [run for run in runs if run.finished]
    keyed = [_keys(run) for run in finished]
    families_of_name: dict[str, set[str]] = defaultdict(set)
    for key in keyed:
        families_of_name[key.name].add(key.family)
    private: dict[tuple[str, str, str, str], dict[str, list[RunRecord]]] = defaultdict(lambda: defaultdict(list))
    plain: dict[tuple[str, str, str], list[RunRecord]] = defaultdict(list)
    variants: dict[str, dict[str, Any]] = {}
    knob_sets: dict[str, dict[str, Any]] = {}
    algorithms: dict[str, str] = {}
    for run, key in zip(finished, keyed):
        knob_sets[key.knobs] = key.knob_values
        algorithms[key.method] = key.algorithm
        if key.variant is None:
            plain[(key.family, key.method, key.knobs)].append(run)
        else:
            variants[key.variant] = key.variant_values
            private[(key.family, key.method, key.knobs, key.variant)][key.level].append(run)
    names = {key.family: key.name if len(families_of_name[key.name]) == 1 else f"{key.name} [setting {key.family[:8]}]" for key in keyed}
    lines = []
    for (family, method, knobs, variant), levels in private.items():
        siblings = [k for k in private if k[:2] == (family, method)]
        shown = _differing([knob_sets[k[2]] for k in siblings], knob_sets[knobs], f"algorithm.{algorithms[method]}.")
        shown += _differing([variants[k[3]] for k in siblings], variants[variant], "")
        built = [_level(members) for members in levels.values()]
        if plain.get((family, method, knobs)):
            built.append(_level(plain[(family, method, knobs)]))
        built.sort(key=lambda level: (math.isnan(level.epsilon), level.epsilon))
        label = f"{method} [{', '.join(shown)}]" if shown else method
        lines.append(Line(names[family], label, built, variants[variant]))
    return sorted(lines, key=lambda line: (line.setting, line.method))


@dataclass(frozen=True)
class _RunKeys:
    name: str
    family: str
    method: str
    algorithm: str
    knobs: str
    knob_values: dict[str, Any]
    variant: str | None  # None without privacy
    variant_values: dict[str, Any]
    level: str


def _keys(run: RunRecord) -> _RunKeys:
    setting = run_setting(run)
    outside = {key: value for key, value in setting.keys.items() if not _is_privacy_key(key)}
    section = {key: value for key, value in setting.keys.items() if _is_privacy_key(key)}
    variant_values = {key: value for key, value in section.items() if key not in LEVEL_KEYS}
    level_values = {key: value for key, value in section.items() if key in LEVEL_KEYS}
    return _RunKeys(
        name=run.scenario_label,
        family=keys_fingerprint({"name": run.scenario_label, **outside}),
        method=method_label(run.scenario),
        algorithm=run.algorithm,
        knobs=_digest(setting.knobs),
        knob_values=setting.knobs,
        variant=_digest(variant_values) if section else None,
        variant_values=variant_values,
        level=_digest(level_values),
    )


def _level(runs: list[RunRecord]) -> Level:
    targets = {_target(run) for run in runs}
    target = targets.pop() if len(targets) == 1 else None
    return Level([LevelRun(run, epsilon_reached(run), final_values(run)) for run in sorted(runs, key=lambda r: r.seed)], target)


def _target(run: RunRecord) -> float | None:
    record = run.manifest.get(PRIVACY_SECTION)
    value = record.get("target_epsilon") if isinstance(record, dict) else None
    return float(value) if isinstance(value, (int, float)) else None


def _is_privacy_key(key: str) -> bool:
    return key == PRIVACY_SECTION or key.startswith(PRIVACY_SECTION + ".")


def _differing(variants: list[dict[str, Any]], own: dict[str, Any], prefix: str) -> list[str]:
    """`key=value` of `own` for each key whose value is not the same in every one of `variants`."""
    keys = list(dict.fromkeys(key for variant in variants for key in variant))
    differing = [key for key in keys if len({json.dumps(variant.get(key), sort_keys=True) for variant in variants}) > 1]
    return [f"{prefix}{key}={json.dumps(own.get(key))}" for key in differing]


def _digest(values: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _number(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
