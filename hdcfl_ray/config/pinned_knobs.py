"""Where a pinned knob's value came from: a value chosen for one setting (a calibration,
an `auto` choice) travels with the scenario file to settings it was never chosen for
(another partition, another dataset), where it may be far from right. A scenario says
which setting each pinned value was chosen for in `chosen_for` (knob key -> the data
setting's fingerprint, `hdcfl-ray validate` prints a run's); a run of the method whose
setting differs says so when it starts, suggests `auto`, and its manifest records it.

The data setting is what a chosen value depends on: the dataset, the partition (its
held-out share aside) and the model; not the method's other knobs, the protocol's
length or how the run executes. Only the keys a scenario sets away from the schema's
defaults enter the fingerprint: two scenarios still agree exactly when their settings do,
and a field the schema gains later (at a default that keeps the old behaviour) leaves
every stored `chosen_for` valid."""

from __future__ import annotations

from typing import Any

from hdcfl_ray.config.fingerprint import keys_fingerprint, setting_keys
from hdcfl_ray.config.safe_keys import flatten
from hdcfl_ray.config.schema import Scenario, method_params

DATA_SETTING_PREFIXES = ("dataset.", "partition.", "model.")
# a share held out for choosing (the same clients and images otherwise), and where the
# files are (the same data on another machine is the same setting)
NOT_DATA_SETTING = frozenset({"partition.validation_fraction", "partition.validation_draw", "dataset.path"})


def data_setting_keys(scenario: Scenario) -> dict[str, Any]:
    """The dataset, partition and model keys the scenario sets away from their defaults."""
    defaults = _schema_defaults(scenario)
    return {
        key: value
        for key, value in setting_keys(scenario).items()
        if key.startswith(DATA_SETTING_PREFIXES) and key not in NOT_DATA_SETTING and (key not in defaults or defaults[key] != value)
    }


def _schema_defaults(scenario: Scenario) -> dict[str, Any]:
    sections = {prefix.rstrip("."): type(getattr(scenario, prefix.rstrip(".")))().model_dump(mode="json") for prefix in DATA_SETTING_PREFIXES}
    return flatten(sections)


def data_setting_fingerprint(scenario: Scenario) -> str:
    """The fingerprint `chosen_for` holds: equal exactly when two scenarios have the same
    dataset, partition and model."""
    return keys_fingerprint(data_setting_keys(scenario))


def pinned_elsewhere(scenario: Scenario) -> list[dict[str, Any]]:
    """The running method's pinned knobs whose value was chosen for another data setting:
    [{"key", "value", "chosen_for", "this_setting"}], in `chosen_for`'s order."""
    name = scenario.algorithm.name
    params = method_params(scenario.algorithm).model_dump(mode="json")
    here = data_setting_fingerprint(scenario)
    found = []
    for key, fingerprint in scenario.chosen_for.items():
        section, _, field = key.rpartition(".")
        if section != f"algorithm.{name}" or field not in params or params[field] == "auto":
            continue
        if fingerprint != here:
            found.append({"key": key, "value": params[field], "chosen_for": fingerprint, "this_setting": here})
    return found


def pinned_knob_notices(scenario: Scenario) -> list[str]:
    return [
        f"{item['key']}: {_shown(item['value'])} was chosen for another setting (chosen_for: {item['chosen_for']}; this run's "
        f"dataset, partition and model give {item['this_setting']}), where it may be far from the best value; set "
        f"{item['key']}=auto to choose it for this setting"
        for item in pinned_elsewhere(scenario)
    ]


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)
