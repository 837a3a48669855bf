"""A report never averages values chosen by different rules or code, and never hides a
pinned value: runs whose `auto` knobs were chosen under two rules (or by two versions of
the code) are rows apart, each named by what chose it, in every format; a run whose knob
was pinned to a value chosen for another data setting is flagged on its row in every
format; runs chosen alike stay one row, as before."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import hdcfl_ray
from analysis.auto_choice import UNRECORDED, choice_tag, choice_tags, chosen_by_note
from hdcfl_ray.auto_knobs.cache import CACHE_VARIABLE, CHOICE_FILE, choice_code
from hdcfl_ray.auto_knobs.digests import code_digest
from hdcfl_ray.auto_knobs.record import AutoKnobsRecord
from tests.conftest import tiny_scenario

pytestmark = pytest.mark.auto_knobs  # one run here chooses its knob for real

FORMATS = ("md", "csv", "latex", "table")
EARLIER_RULE = "highest final mean client accuracy on held-out images (ties: the smaller value)"
ANOTHER_SETTING = "0123456789abcdef"  # a data-setting fingerprint no scenario here has


def small(section: dict[str, Any], method: str = "fedprox", **sections: Any) -> dict[str, Any]:
    """Four clients, one round (a choice of FedProx's mu takes seconds); `section` the method's own."""
    return tiny_scenario(
        algorithm={"name": method, **({method: section} if section else {})}, partition={"num_clients": 4, "test_per_client": 20},
        protocol={"rounds": 1}, runtime={"backend": "local"}, **sections,
    )  # fmt: skip


def edited_copy(source: Path, target: Path, seed: int | None = None, name: str | None = None, **record: Any) -> Path:
    """A copy of a finished run whose auto record differs in `record` (a value None drops
    the key, as a record from before it was kept has none), and whose seed or scenario
    name is `seed` or `name`."""
    shutil.copytree(source, target)
    manifest = json.loads((target / "manifest.json").read_text())
    for key, value in record.items():
        if value is None:
            manifest["auto_knobs"].pop(key, None)
        else:
            manifest["auto_knobs"][key] = value
    scenario_path = target / "scenario.yaml"
    scenario = scenario_path.read_text()
    if seed is not None:
        manifest["seed"] = seed
        scenario = scenario.replace("seed: 7\n", f"seed: {seed}\n", 1)
    if name is not None:
        manifest["scenario_name"] = name
        scenario = scenario.replace("name: tiny\n", f"name: {name}\n", 1)
    scenario_path.write_text(scenario)
    (target / "manifest.json").write_text(json.dumps(manifest))
    return target


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("report-auto-choice")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_VARIABLE, str(root / "cache"))
        chosen = hdcfl_ray.simulate(small({"mu": "auto"}), out=root / "chosen", progress=False).dir
        from_cache = hdcfl_ray.simulate(small({"mu": "auto"}), out=root / "elsewhere" / "from-cache", progress=False).dir
        forget_the_code(Path(manifest(chosen)["auto_knobs"]["cache"]) / CHOICE_FILE)
        from_old_entry = hdcfl_ray.simulate(small({"mu": "auto"}), out=root / "elsewhere" / "from-old-entry", progress=False).dir
    # `chosen_for` is part of a run's setting: the run beside the pinned one says the same, so the two share a column
    chosen_for = {"algorithm.fedprox.mu": ANOTHER_SETTING}
    return {
        "chosen": chosen,
        "from_cache": from_cache,
        "from_old_entry": from_old_entry,
        "same_rule_seed8": edited_copy(chosen, root / "same-rule-seed8", seed=8),
        # a run of the same seed made last week: another rule, and no code in its record
        "earlier_rule": edited_copy(chosen, root / "earlier-rule", rule=EARLIER_RULE, code=None),
        "other_code": edited_copy(chosen, root / "other-code", code="f" * 32),
        "pinned": hdcfl_ray.simulate(small({"mu": 0.01}, chosen_for=chosen_for), out=root / "pinned", progress=False).dir,
        "beside_pinned": hdcfl_ray.simulate(small({}, "local", chosen_for=chosen_for), out=root / "local", progress=False).dir,
    }


def manifest(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "manifest.json").read_text())


def forget_the_code(choice_file: Path) -> None:
    """Make a kept choice look as one kept before records held their code."""
    document = json.loads(choice_file.read_text())
    del document["record"]["code"]
    choice_file.write_text(json.dumps(document))


def first_table(markdown: str) -> str:
    """The first table of a Markdown report, with its note."""
    return markdown.split("### ")[1]


def test_a_choice_records_the_code_that_made_it_and_a_run_served_it_from_the_cache_too(runs):
    made, served = manifest(runs["chosen"])["auto_knobs"], manifest(runs["from_cache"])["auto_knobs"]
    assert made["code"] == code_digest() and made["from_cache"] is False
    assert served["from_cache"] is True and served["code"] == made["code"]
    # an entry kept before records held their code matched this code's key all the same
    old_entry = manifest(runs["from_old_entry"])["auto_knobs"]
    assert old_entry["from_cache"] is True and old_entry["code"] == made["code"]


def test_a_record_from_before_the_code_was_kept_still_loads_and_writes_no_code():
    old = {"method": "pacfl", "rule": "r", "rounds": 8, "full_rounds": 20, "validation_fraction": 0.2, "knobs": []}
    record = AutoKnobsRecord.from_dict(old)
    assert record.code == "" and "code" not in record.as_dict() and record.rule == "r"


def test_the_code_of_a_plugin_methods_choice_names_the_plugin_too():
    assert choice_code({"code": "a" * 32, "plugin_code": ""}) == "a" * 32
    assert choice_code({"code": "a" * 32, "plugin_code": "b" * 32}) == f"{'a' * 32}+{'b' * 32}"
    assert choice_tag("code", f"{'a' * 32}+{'b' * 32}") == "auto code aaaaaaaa+bbbbbbbb"


def test_tags_name_the_rule_where_rules_differ_and_the_code_only_where_one_rule_differs_in_it():
    rule_a, rule_b = {"rule": "A", "code": "c1"}, {"rule": "B", "code": "c2"}
    assert choice_tags({1: rule_a, 2: dict(rule_a), 3: None}) == {1: [], 2: [], 3: []}
    assert choice_tags({1: rule_a, 2: rule_b}) == {1: [choice_tag("rule", "A")], 2: [choice_tag("rule", "B")]}
    assert choice_tags({1: rule_a, 2: {"rule": "A", "code": UNRECORDED}}) == {1: ["auto code c1"], 2: ["auto code unrecorded"]}
    three = choice_tags({1: rule_a, 2: {"rule": "A", "code": "c3"}, 3: rule_b})
    assert three[3] == [choice_tag("rule", "B"), "auto code c2"] and three[1] != three[2]


@pytest.mark.parametrize("fmt", FORMATS)
def test_runs_chosen_under_two_rules_are_two_rows_named_by_their_rule_in_every_format(runs, fmt):
    text = hdcfl_ray.report([runs["chosen"], runs["earlier_rule"]], format=fmt)
    current = choice_tag("rule", manifest(runs["chosen"])["auto_knobs"]["rule"])
    earlier = choice_tag("rule", EARLIER_RULE)
    assert f"fedprox [{current}]" in text and f"fedprox [{earlier}]" in text
    assert "auto code" not in text  # the rules tell them apart already
    flat = " ".join(text.split())  # the terminal tables wrap their notes
    assert f"[{earlier}] {EARLIER_RULE}" in flat  # the note spells out each rule


def test_runs_of_one_rule_chosen_by_other_code_are_two_rows_and_an_old_record_counts_as_other_code(runs):
    text = hdcfl_ray.report([runs["chosen"], runs["other_code"], runs["same_rule_seed8"]], format="md")
    table = first_table(text)
    assert f"fedprox [auto code {code_digest()[:8]}]" in table and "fedprox [auto code ffffffff]" in table
    assert "2 runs" not in table and "3 runs; seeds 7, 8." in table
    old_and_new = first_table(hdcfl_ray.report([runs["chosen"], edited_copy(runs["chosen"], runs["chosen"].parent / "no-code", code=None)]))
    assert "fedprox [auto code unrecorded]" in old_and_new and "chosen before runs recorded the code that chose" in old_and_new


def test_runs_chosen_alike_stay_one_row_averaged_over_their_seeds_and_the_notes_say_nothing_new(runs):
    text = hdcfl_ray.report([runs["chosen"], runs["same_rule_seed8"]], format="md")
    table = first_table(text)
    assert "| fedprox |" in table and "auto rule" not in text and "auto code" not in text
    assert "2 runs; seeds 7, 8." in table and "Rows split" not in text and "pinned for another setting" not in text


def test_the_split_holds_in_every_column_so_no_macro_value_averages_two_rules(runs):
    """One rule in one setting, the other in another: each column alone agrees, yet the rows are apart."""
    elsewhere = edited_copy(runs["earlier_rule"], runs["chosen"].parent / "earlier-rule-tiny2", name="tiny2")
    table = first_table(hdcfl_ray.report([runs["chosen"], elsewhere]))
    earlier = choice_tag("rule", EARLIER_RULE)
    assert "| Method | tiny | tiny2 | Avg. rank ↓ |" in table
    assert any(row.startswith(f"| fedprox [{earlier}] | - |") for row in table.split("\n"))
    macro = hdcfl_ray.report([runs["chosen"], elsewhere]).split("### Client-level results macro-averaged")[1].split("###")[0]
    assert "| fedprox |" not in macro and f"| fedprox [{earlier}] | - |" in macro  # in one setting of two: no macro value


def test_the_note_spells_out_only_the_tags_the_rows_carry():
    assert chosen_by_note([("fedprox [auto rule x]", {"rule": "x"})]) == ""  # a tag names a digest, never the text
    tag = choice_tag("rule", "x")
    note = chosen_by_note([(f"fedprox [{tag}]", {"rule": "x"}), ("fedprox", {"rule": "y"})])
    assert note.endswith(f"[{tag}] x.") and choice_tag("rule", "y") not in note


def test_the_manifest_of_a_pinned_run_records_the_setting_it_was_chosen_for(runs):
    (pinned,) = manifest(runs["pinned"])["pinned_for_another_setting"]
    assert pinned["key"] == "algorithm.fedprox.mu" and pinned["chosen_for"] == ANOTHER_SETTING


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_run_with_a_knob_pinned_for_another_setting_is_flagged_on_its_row_in_every_format(runs, fmt):
    text = hdcfl_ray.report([runs["pinned"], runs["beside_pinned"]], format=fmt)
    flat = " ".join(text.split())
    assert "pinned for another setting (mu 0.01; 1 of 1 seed)" in flat
    assert "[pinned for another setting] a knob of the method was pinned to a value chosen for another" in flat
    lines = text.splitlines()
    if fmt == "md":  # on the pinned row's cells, not on the row beside it
        assert any(line.startswith("| fedprox |") and "pinned for another setting" in line for line in lines)
        assert all("pinned" not in line for line in lines if line.startswith("| local |"))
    if fmt == "csv":  # in the column CSV keeps flags in
        assert any(line.startswith("fedprox,") and "tiny: pinned for another setting (mu 0.01" in line for line in lines)
        assert all("pinned" not in line for line in lines if line.startswith("local,"))


def test_tables_derived_from_the_runs_carry_the_pinned_flag_too(runs):
    from analysis.final_metrics import run_metrics
    from analysis.report_tables import macro_table
    from analysis.runs import load_runs

    records = run_metrics(load_runs([runs["pinned"], runs["beside_pinned"]]))
    rows = {row[0].value: row[0].flags for row in macro_table(records).rows if not row[0].value.startswith("reference: ")}
    assert rows == {"fedprox": ("pinned for another setting (mu 0.01; 1 of 1 seed) in tiny",), "local": ()}
