"""The scenario reference page (docs/scenario-reference.md, linked from README.md) is the schema's own:
the block between the marker comments is what `hdcfl_ray.config.reference` renders, it loads as the
default scenario, and every key has a meaning."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, get_args

import pytest
import yaml
from pydantic import BaseModel, Field, create_model

from hdcfl_ray.config.loading import build_scenario, scenario_to_yaml
from hdcfl_ray.config.reference import (
    REFERENCE_PAGE,
    REGENERATE_COMMAND,
    extract_reference,
    main,
    scenario_reference,
    with_reference,
)
from hdcfl_ray.config.schema import Scenario, Section

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / REFERENCE_PAGE

def reachable_models(model: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """Every model nested in `model` (itself included), by class name: through field annotations
    and through default values, so a section built with create_model is found as well."""
    found: dict[str, type[BaseModel]] = {}

    def visit(candidate: Any) -> None:
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            if candidate.__name__ not in found:
                found[candidate.__name__] = candidate
                for field in candidate.model_fields.values():
                    visit(field.annotation)
                    if isinstance(field.default, BaseModel):
                        visit(type(field.default))
        for argument in get_args(candidate):
            visit(argument)

    visit(model)
    return found


def required_keys_only(model: type[BaseModel], raw: dict[str, Any]) -> dict[str, Any]:
    """The keys of `raw` that `model` requires (nested), and nothing else."""
    kept: dict[str, Any] = {}
    for key, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel) and isinstance(raw.get(key), dict):
            nested = required_keys_only(annotation, raw[key])
            if nested or field.is_required():
                kept[key] = nested
        elif field.is_required():
            kept[key] = raw[key]
    return kept


def key_paths(tree: dict[str, Any], prefix: str = "") -> list[str]:
    paths: list[str] = []
    for key, value in tree.items():
        paths.append(f"{prefix}{key}")
        if isinstance(value, dict):
            paths += key_paths(value, f"{prefix}{key}.")
    return paths


def test_reference_page_block_is_the_generated_reference() -> None:
    page = REFERENCE.read_text(encoding="utf-8")
    stale = f"{REFERENCE_PAGE}'s scenario reference is out of date with hdcfl_ray/config/schema.py; run: {REGENERATE_COMMAND}"
    assert extract_reference(page) == scenario_reference(), stale
    assert with_reference(page) == page, stale


def test_readme_links_the_reference_page_and_holds_no_copy() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"({REFERENCE_PAGE})" in readme
    assert "<!-- scenario-reference:" not in readme


def test_reference_loads_as_the_default_scenario() -> None:
    raw = yaml.safe_load(scenario_reference())
    scenario = build_scenario(raw, source="scenario reference")
    default = build_scenario(required_keys_only(Scenario, raw), source="required keys only")
    assert scenario_to_yaml(scenario) == scenario_to_yaml(default)


def test_reference_lists_every_key_of_the_schema() -> None:
    raw = yaml.safe_load(scenario_reference())
    assert key_paths(raw) == key_paths(build_scenario(raw).model_dump(mode="json"))


def test_required_keys_are_marked_and_shown_with_an_example() -> None:
    lines = scenario_reference().splitlines()
    assert lines[0].startswith("name: my-run ") and "# required;" in lines[0]
    algorithm = next(index for index, line in enumerate(lines) if line.startswith("algorithm:"))
    assert lines[algorithm + 1].startswith("  name: ") and "# required;" in lines[algorithm + 1]


DESCRIBED_HERE = sorted(reachable_models(Scenario))


@pytest.mark.parametrize("model_name", DESCRIBED_HERE)
def test_every_field_has_a_description(model_name: str) -> None:
    model = reachable_models(Scenario)[model_name]
    undescribed = [key for key, field in model.model_fields.items() if not (field.description or "").strip()]
    assert undescribed == [], f"{model_name}: give these fields Field(..., description=...): {', '.join(undescribed)}"


def test_sections_are_the_schema_base_class() -> None:
    # every section forbids unknown keys; a model outside Section would not
    assert all(issubclass(model, Section) for model in reachable_models(Scenario).values())


class _Steps(Section):
    rate: float = Field(0.5, description="step size")
    kind: Literal["fast", "slow"] = Field("slow", description="how")


class _Other(Section):
    count: int = 3


def test_a_section_built_with_create_model_renders_name_then_each_method_section() -> None:
    methods = create_model(
        "Methods",
        __base__=Section,
        name=(Literal["steps", "other"], Field(description="the method")),
        steps=(_Steps, _Steps(rate=0.25)),
        other=(_Other, _Other()),
    )
    run = create_model("Run", __base__=Section, seed=(int, Field(1, description="seed")), method=(methods, ...))
    assert scenario_reference(run).splitlines() == [
        "seed: 1                         # seed",
        "method:                         # required",
        "  name: steps                   # required; steps | other; the method",
        "  steps:",
        "    rate: 0.25                  # step size",
        "    kind: slow                  # fast | slow; how",
        "  other:",
        "    count: 3",
    ]


def test_write_rewrites_the_block_and_check_reports_staleness(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n<!-- scenario-reference:start -->\nold\n<!-- scenario-reference:end -->\n\nafter\n")
    assert main(["--write", str(page)]) == 0
    text = page.read_text()
    assert text.startswith("# Title\n\n<!-- scenario-reference:start -->\n```yaml\nname: my-run ")
    assert text.endswith("```\n<!-- scenario-reference:end -->\n\nafter\n")
    assert main(["--check", str(page)]) == 0
    page.write_text(text.replace("seed: 42 ", "seed: 43 "))
    assert main(["--check", str(page)]) == 1
    assert REGENERATE_COMMAND in capsys.readouterr().err
