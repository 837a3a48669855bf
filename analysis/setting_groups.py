"""Which runs a report averages, and the names of its columns and rows.

A column is a setting: the runs of one scenario name whose resolved scenarios agree in
every key that makes a setting (hdcfl_ray/config/fingerprint.py says which: all but the
seed, the method and its section, the row's label and the keys a rerun may change).
When all runs of a name share one setting the column is just the name; otherwise each
column is the name followed by the keys that set it apart from the name's other
columns: `quickstart [partition.kind=label_subset, partition.k=3]`.

A row is a method (or the variant `output.label` names). Runs of one method in one
column that differ in the method's own knobs are variants of it, a row each: the one at
the method's defaults keeps the method's name, the others are named by the knobs where
they leave the defaults: `hdcfl [mix=0.0]`. A method calibrated per setting (another
value in each column) stays one row. Runs whose `auto` knobs were chosen under another
rule, or by other code, are rows apart too, named by what differs
(analysis/auto_choice.py): `pacfl [auto rule 1a2b3c4d]`.

Within a row of a column each seed counts once: two runs of the same method, setting
and seed are refused, naming both folders, unless the caller says which to keep.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any

from hdcfl_ray.config.fingerprint import default_method_knobs, keys_fingerprint, method_knobs, setting_keys
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.config.safe_keys import flatten, own_sections
from hdcfl_ray.errors import ScenarioError

from analysis.auto_choice import choice_of, choice_tags
from analysis.runs import RunRecord, method_label

KEEP_CHOICES = ("newest", "oldest")  # which of two runs of one method, setting and seed a report keeps
KEEP_OPTION = "--keep-duplicate {}"  # how a user of the command line says which to keep
MAX_KEYS_SHOWN = 4  # a column named by more differing keys shows these and the setting's digest
_ABSENT = "(absent)"
# A method that needs no settings of its own: it stands in for a method this process
# cannot read (a plugin not loaded), whose section is then not part of the setting anyway.
_STAND_IN_METHOD = "local"


@dataclass(frozen=True)
class RunSetting:
    """What a run's resolved scenario says, as reports compare it."""

    keys: dict[str, Any]  # the setting's keys (fingerprint.setting_keys)
    fingerprint: str
    knobs: dict[str, Any]  # the method's own section, flat
    default_knobs: dict[str, Any] | None  # its defaults; None where the method is unknown here


class DuplicateRunsError(ScenarioError):
    """Two runs of one method, setting and seed, and no word on which to keep."""


@dataclass(frozen=True)
class Placement:
    runs: list[RunRecord]  # each with its column and row, one per (column, row, seed)
    duplicates: list[RunRecord]  # runs left out because the caller kept another of the same seed


def run_setting(run: RunRecord) -> RunSetting:
    """The run's setting keys and knobs, read through this version's schema (so a key a
    newer version added with its default compares equal to a run that predates it)."""
    source = str(run.run_dir / "scenario.yaml")
    raw = own_sections(run.scenario)
    try:
        scenario = build_scenario(raw, source=source)
    except ScenarioError:
        # The method's own section may be what this process cannot read (a plugin's
        # method, its plugin not loaded); the setting does not include it, so it is read
        # without, and the knobs are taken as the run wrote them.
        algorithm = raw.get("algorithm") if isinstance(raw.get("algorithm"), dict) else {}
        section = algorithm.get(str(algorithm.get("name")))
        try:
            stand_in = build_scenario({**raw, "algorithm": {"name": _STAND_IN_METHOD}}, source=source)
        except ScenarioError as error:
            raise ScenarioError(
                f"report: {source} cannot be read by this version, so which runs share its setting is unknown: {error}\n"
                "A plugin's runs need the plugin (hdcfl-ray --plugin MODULE report ...); a run made by another version "
                "is reported with that version (its manifest.json names the commit), or left out of the paths given"
            ) from None
        keys = setting_keys(stand_in)
        return RunSetting(keys, keys_fingerprint(keys), flatten(section) if isinstance(section, dict) else {}, None)
    keys = setting_keys(scenario)
    return RunSetting(keys, keys_fingerprint(keys), method_knobs(scenario), default_method_knobs(scenario))


def place_runs(runs: list[RunRecord], keep: str | None = None, option: str = KEEP_OPTION) -> Placement:
    """Give every run its column and row (module docstring). Two runs of one column, row
    and seed raise DuplicateRunsError naming both folders, unless `keep` is `newest` or
    `oldest`: then the run started last (first) is kept and the others are returned as
    `duplicates`. `option` is how the caller's user writes `keep` ({} for the choice), for messages."""
    if keep is not None and keep not in KEEP_CHOICES:
        raise ScenarioError(f"{option.format(keep)}: choose {' or '.join(KEEP_CHOICES)}")
    settings = {run.run_dir: run_setting(run) for run in runs}
    columns = _column_names(runs, settings)
    placed = [replace(run, column=columns[run.run_dir]) for run in runs]
    rows = _row_names(placed, settings)
    placed = [replace(run, row=rows[run.run_dir]) for run in placed]
    return _one_run_per_seed(placed, keep, option)


def _column_names(runs: list[RunRecord], settings: dict[Any, RunSetting]) -> dict[Any, str]:
    by_name: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for run in runs:
        setting = settings[run.run_dir]
        by_name[run.scenario_label][setting.fingerprint] = setting.keys
    names: dict[str, str] = {}  # (label, fingerprint) joined -> column
    for label, variants in by_name.items():
        differing = _differing_keys(list(variants.values()))
        for fingerprint, keys in variants.items():
            if len(variants) == 1:
                names[f"{label}\0{fingerprint}"] = label
                continue
            shown = [f"{key}={_show(keys.get(key, _ABSENT))}" for key in differing[:MAX_KEYS_SHOWN]]
            if len(differing) > MAX_KEYS_SHOWN:  # the digest keeps the name unique where keys are cut
                shown[-1:] = [f"+{len(differing) - MAX_KEYS_SHOWN + 1} more keys", f"setting {fingerprint[:8]}"]
            names[f"{label}\0{fingerprint}"] = f"{label} [{', '.join(shown)}]"
    return {run.run_dir: names[f"{run.scenario_label}\0{settings[run.run_dir].fingerprint}"] for run in runs}


def _row_names(runs: list[RunRecord], settings: dict[Any, RunSetting]) -> dict[Any, str]:
    groups: dict[tuple[str, str], list[RunRecord]] = defaultdict(list)
    parts: dict[Any, list[str]] = {}  # run -> what its row name adds to the method's in brackets
    for run in runs:
        if (run.scenario.get("output") or {}).get("label"):
            parts[run.run_dir] = []  # the user named the variant
        else:
            groups[(run.setting, method_label(run.scenario))].append(run)
    for (_, method), members in groups.items():
        knob_sets = {json.dumps(settings[run.run_dir].knobs, sort_keys=True): settings[run.run_dir].knobs for run in members}
        differing = _differing_keys(list(knob_sets.values())) if len(knob_sets) > 1 else []
        defaults = [settings[run.run_dir].default_knobs for run in members]
        known = defaults[0] if all(d is not None and d == defaults[0] for d in defaults) else None
        for run in members:
            knobs = settings[run.run_dir].knobs
            shown = [key for key in differing if known is None or knobs.get(key, _ABSENT) != known.get(key, _ABSENT)]
            parts[run.run_dir] = [f"{key}={_show(knobs.get(key, _ABSENT))}" for key in shown]
    for run_dir, tags in _choice_tags(runs).items():
        parts[run_dir] += tags
    return {run.run_dir: _named(method_label(run.scenario), parts[run.run_dir]) for run in runs}


def _choice_tags(runs: list[RunRecord]) -> dict[Any, list[str]]:
    """Each run's tags naming what chose its auto knobs where runs of its row name differ
    in it (analysis/auto_choice.py). Over the whole report, not per column: a row is then
    one rule in every column, and no macro value averages two."""
    by_name: dict[str, list[RunRecord]] = defaultdict(list)
    for run in runs:
        by_name[method_label(run.scenario)].append(run)
    tags: dict[Any, list[str]] = {}
    for members in by_name.values():
        tags.update(choice_tags({run.run_dir: choice_of(run.manifest) for run in members}))
    return tags


def _named(method: str, parts: list[str]) -> str:
    return f"{method} [{', '.join(parts)}]" if parts else method


def _one_run_per_seed(runs: list[RunRecord], keep: str | None, option: str) -> Placement:
    by_seed: dict[tuple[str, str, int], list[RunRecord]] = defaultdict(list)
    for run in runs:
        by_seed[(run.setting, run.method, run.seed)].append(run)
    repeated = {key: sorted(members, key=_start_order) for key, members in by_seed.items() if len(members) > 1}
    if not repeated:
        return Placement(runs, [])
    if keep is None:
        lines = [f"  {setting} / {method} / seed {seed}: {', '.join(str(run.run_dir) for run in members)}"
                 for (setting, method, seed), members in sorted(repeated.items())]  # fmt: skip
        raise DuplicateRunsError(
            f"report: {len(repeated)} setting(s) hold more than one run of the same method and seed, and a report "
            "counts each seed once:\n" + "\n".join(lines) + "\nLeave all but one of each out of the folders given, "
            f"or pass {option.format('newest')} (or {option.format('oldest')}) to keep the run of each that started last (first)"
        )
    passed_over = {id(run) for members in repeated.values() for run in (members[:-1] if keep == "newest" else members[1:])}
    return Placement([run for run in runs if id(run) not in passed_over], [run for run in runs if id(run) in passed_over])


def check_calibration_runs(runs: list[RunRecord], key: str) -> None:
    """A calibration table compares one knob on one setting: its runs must agree in every
    setting key and every knob of their method but `key`, and hold one run per value
    and seed; ScenarioError naming the keys or folders otherwise."""
    short = key.split(".", 2)[2] if key.startswith("algorithm.") and key.count(".") >= 2 else None
    compared: dict[str, dict[str, Any]] = {}
    by_value: dict[tuple[str, str, int], list[RunRecord]] = defaultdict(list)
    for run in runs:
        setting = run_setting(run)
        method = str((run.scenario.get("algorithm") or {}).get("name"))
        knobs = {f"algorithm.{method}.{name}": value for name, value in setting.knobs.items() if name != short}
        compared[str(run.run_dir)] = {**{k: v for k, v in setting.keys.items() if k != key}, **knobs}
        value = setting.knobs.get(short, _ABSENT) if short is not None else setting.keys.get(key, _ABSENT)
        by_value[(_show(value), run.method, run.seed)].append(run)
    differing = _differing_keys(list(compared.values()))
    if differing:
        raise ScenarioError(
            f"calibration of {key}: its runs differ in more than {key}, so their scores do not compare one knob: "
            f"{', '.join(differing[:MAX_KEYS_SHOWN * 2])}. Calibrate in a folder of its own (--out), or move the runs "
            "made with other settings aside"
        )
    repeated = {group: members for group, members in by_value.items() if len(members) > 1}
    if repeated:
        listed = "; ".join(f"{key} = {value}, {method}, seed {seed}: {', '.join(str(run.run_dir) for run in members)}"
                           for (value, method, seed), members in sorted(repeated.items()))  # fmt: skip
        raise DuplicateRunsError(f"calibration of {key}: more than one run of a value and seed ({listed}); keep one of each")


def duplicates_note(duplicates: list[RunRecord], keep: str | None) -> str:
    """'Left out as repeats ...' naming each run a report passed over for another of the same seed ('' when none)."""
    if not duplicates:
        return ""
    named = ", ".join(sorted(f"{run.setting}/{run.method} seed {run.seed} ({run.run_dir})" for run in duplicates))
    return f"Left out as repeats of a seed ({keep} kept): {len(duplicates)} run(s): {named}."


def _start_order(run: RunRecord) -> tuple[str, str]:
    return (run.started_at, str(run.run_dir))


def _differing_keys(variants: list[dict[str, Any]]) -> list[str]:
    """The keys whose values are not the same in every one of `variants`, in the order
    they come in (the schema's)."""
    keys = list(dict.fromkeys(key for variant in variants for key in variant))
    return [key for key in keys if len({json.dumps(variant.get(key, _ABSENT), sort_keys=True) for variant in variants}) > 1]


def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)
