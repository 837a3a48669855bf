"""A knob pinned to a value chosen for one data setting says so when a run of another
setting uses it: the quickstart pins PACFL's threshold chosen under rotation, and a label
skew run with it is told at start (and its manifest records it), with `auto` suggested."""

from __future__ import annotations

from pathlib import Path

import pytest

import hdcfl_ray
from hdcfl_ray.config.loading import load_scenario
from hdcfl_ray.config.pinned_knobs import data_setting_fingerprint, data_setting_keys, pinned_knob_notices
from hdcfl_ray.runtime.driver import prepare_run

QUICKSTART = Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.yaml"


def test_the_quickstarts_pinned_knobs_were_chosen_for_its_own_setting() -> None:
    scenario = load_scenario(QUICKSTART)
    assert set(scenario.chosen_for.values()) == {data_setting_fingerprint(scenario)}
    for method in ("pacfl", "ifca", "fedprox", "fedce", "fedsoft"):
        assert pinned_knob_notices(load_scenario(QUICKSTART, [f"algorithm.name={method}"])) == []


@pytest.mark.parametrize(
    "changes",
    [["partition.kind=label_subset", "partition.k=3"], ["partition.kind=dirichlet", "partition.alpha=0.1"], ["dataset.name=synthetic"]],
    ids=["label-subset", "dirichlet", "another-dataset"],
)
def test_a_pinned_value_on_another_data_setting_is_named_with_auto_suggested(changes: list[str]) -> None:
    scenario = load_scenario(QUICKSTART, ["algorithm.name=pacfl", *changes])
    (notice,) = pinned_knob_notices(scenario)
    assert notice.startswith("algorithm.pacfl.threshold: 8 was chosen for another setting")
    assert data_setting_fingerprint(scenario) in notice and "algorithm.pacfl.threshold=auto" in notice
    assert notice in prepare_run(scenario).notices


def test_settings_that_do_not_change_the_data_keep_quiet_and_auto_is_never_named() -> None:
    for changes in (["protocol.rounds=5"], ["seed=17"], ["runtime.num_cpus=1"], ["partition.validation_fraction=0.2"]):
        assert pinned_knob_notices(load_scenario(QUICKSTART, ["algorithm.name=pacfl", *changes])) == [], changes
    auto = load_scenario(QUICKSTART, ["algorithm.name=pacfl", "partition.kind=label_subset", "partition.k=3", "algorithm.pacfl.threshold=auto"])
    assert pinned_knob_notices(auto) == []


def test_the_manifest_records_a_knob_pinned_for_another_setting(tmp_path: Path) -> None:
    overrides = {"algorithm.name": "pacfl", "partition.kind": "label_subset", "partition.k": 3, "protocol.rounds": 1}
    run = hdcfl_ray.simulate(QUICKSTART, overrides=overrides, out=tmp_path / "run", progress=False)
    assert any("was chosen for another setting" in notice for notice in run.notices)
    (pinned,) = run.manifest["pinned_for_another_setting"]
    assert pinned["key"] == "algorithm.pacfl.threshold" and pinned["this_setting"] == run.manifest["data_setting"]


def test_keys_left_at_their_defaults_stay_out_so_a_new_schema_field_keeps_stored_fingerprints() -> None:
    scenario = load_scenario(QUICKSTART)
    keys = data_setting_keys(scenario)
    assert keys and "partition.partition_by" not in keys and "dataset.sequence_length" not in keys
    written_out = load_scenario(QUICKSTART, ["partition.ids_per_client=1", "dataset.sequence_length=80"])
    assert data_setting_fingerprint(written_out) == data_setting_fingerprint(scenario)
    assert data_setting_fingerprint(load_scenario(QUICKSTART, ["model.width=32"])) != data_setting_fingerprint(scenario)
