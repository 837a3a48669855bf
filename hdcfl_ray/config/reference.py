"""The scenario reference: every key of the schema with its default and its meaning, as one YAML block.

The block is rendered from the pydantic models alone (field order, defaults, `Literal` choices and each
field's `description`), so a key added to the schema shows up without anyone copying it by hand.
docs/scenario-reference.md holds the block between two marker comments;
`python -m hdcfl_ray.config.reference --write docs/scenario-reference.md` rewrites it and
tests/test_readme_reference.py fails while it is out of date.
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import to_jsonable_python

from hdcfl_ray.config.schema import Scenario

START_MARKER = "<!-- scenario-reference:start -->"
END_MARKER = "<!-- scenario-reference:end -->"
REFERENCE_PAGE = "docs/scenario-reference.md"  # the page that holds the block, from the repository root
REGENERATE_COMMAND = f"python -m hdcfl_ray.config.reference --write {REFERENCE_PAGE}"

# Comments start in this column; a longer `key: value` keeps two spaces before its comment
# rather than pushing every other comment to the right.
COMMENT_COLUMN = 32
_INDENT = "  "


def scenario_reference(model: type[BaseModel] = Scenario) -> str:
    """The YAML text of every key of `model`, nested sections indented, each `key: default   # meaning`.

    A required key shows a placeholder (its first `examples` entry, else its first `Literal` choice) and its
    comment starts with "required", so the block still loads as a scenario."""
    return section_reference(model)


def section_reference(model: type[BaseModel], defaults: BaseModel | None = None, depth: int = 0) -> str:
    """`scenario_reference` of one section, its keys indented `depth` levels; `defaults`: an
    instance whose values are shown (a nested section set there is shown key by key)."""
    lines = _section_lines(model, defaults, depth)
    return "".join(_aligned(left, comment) + "\n" for left, comment in lines)


def fenced_reference() -> str:
    return f"```yaml\n{scenario_reference()}```\n"


def with_reference(markdown: str) -> str:
    """`markdown` with the text between the two marker comments replaced by the current reference."""
    return with_block(markdown, START_MARKER, END_MARKER, fenced_reference())


def extract_reference(markdown: str) -> str:
    """The YAML between the marker comments of `markdown` (without its code fence)."""
    block = block_between(markdown, START_MARKER, END_MARKER)
    if not (block.startswith("```yaml\n") and block.endswith("\n```\n")):
        raise ValueError(f"the text between {START_MARKER} and {END_MARKER} is not one ```yaml code block")
    return block.removeprefix("```yaml\n").removesuffix("```\n")


def with_block(markdown: str, start_marker: str, end_marker: str, body: str) -> str:
    """`markdown` with the text between the two marker comments replaced by `body` (a generated block)."""
    start, end = _block_span(markdown, start_marker, end_marker)
    return markdown[:start] + "\n" + body + markdown[end:]


def block_between(markdown: str, start_marker: str, end_marker: str) -> str:
    """The text between the two marker comments of `markdown`, without the line break after the first."""
    start, end = _block_span(markdown, start_marker, end_marker)
    return markdown[start:end].removeprefix("\n")


def _block_span(markdown: str, start_marker: str, end_marker: str) -> tuple[int, int]:
    """Offsets just after the start marker and at the end marker."""
    for marker in (start_marker, end_marker):
        if markdown.count(marker) != 1:
            raise ValueError(f"expected the marker {marker} exactly once, found it {markdown.count(marker)} times")
    start = markdown.index(start_marker) + len(start_marker)
    end = markdown.index(end_marker)
    if end < start:
        raise ValueError(f"{end_marker} comes before {start_marker}")
    return start, end


def _section_lines(model: type[BaseModel], defaults: BaseModel | None, depth: int) -> list[tuple[str, str]]:
    """(`key: value` text, comment) for every field of `model`; `defaults` is the section's default
    instance when the enclosing section has one (a nested default may differ from the class's own)."""
    lines: list[tuple[str, str]] = []
    indent = _INDENT * depth
    for key, field in model.model_fields.items():
        comment = _comment(model, key, field)
        value = getattr(defaults, key) if defaults is not None else _field_default(field)
        if isinstance(value, BaseModel):
            lines.append((f"{indent}{key}:", comment))
            lines += _section_lines(type(value), value, depth + 1)
        elif value is _REQUIRED and _section_model(field.annotation) is not None:
            lines.append((f"{indent}{key}:", comment))
            lines += _section_lines(_section_model(field.annotation), None, depth + 1)
        else:
            shown = _placeholder(model, key, field) if value is _REQUIRED else value
            lines.append((f"{indent}{key}: {_yaml_value(shown)}", comment))
    return lines


_REQUIRED = object()


def _field_default(field: FieldInfo) -> Any:
    return _REQUIRED if field.is_required() else field.get_default(call_default_factory=True)


def _section_model(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _choices(annotation: Any) -> list[Any] | None:
    """The allowed values when the annotation is made only of Literals (and None); else None."""
    members = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    choices: list[Any] = []
    for member in members:
        if member is type(None):
            choices.append(None)
        elif get_origin(member) is Literal:
            choices += get_args(member)
        else:
            return None
    return choices


def _placeholder(model: type[BaseModel], key: str, field: FieldInfo) -> Any:
    if field.examples:
        return field.examples[0]
    choices = [choice for choice in _choices(field.annotation) or [] if choice is not None]
    if choices:
        return choices[0]
    raise ValueError(f"{model.__name__}.{key} is required but has neither examples nor Literal choices to show")


def _comment(model: type[BaseModel], key: str, field: FieldInfo) -> str:
    description = field.description or ""
    if "\n" in description:
        raise ValueError(f"{model.__name__}.{key}: a description is one line (it becomes a YAML comment)")
    choices = _choices(field.annotation)
    parts = [
        "required" if field.is_required() else "",
        " | ".join(_yaml_value(choice) for choice in choices) if choices else "",
        description,
    ]
    return "; ".join(part for part in parts if part)


def _yaml_value(value: Any) -> str:
    """`value` as YAML would write it inline: null, false, 0.0005, [0.0, 90.0], text."""
    text = yaml.safe_dump(to_jsonable_python(value), default_flow_style=True, width=2**31 - 1, allow_unicode=True)
    return text.strip().removesuffix("\n...").strip()


def _aligned(left: str, comment: str) -> str:
    if not comment:
        return left
    return f"{left.ljust(COMMENT_COLUMN - 2)}  # {comment}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hdcfl_ray.config.reference",
        description="Print the scenario reference, or rewrite / check the copy between the marker comments of a file.",
    )
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", metavar="MARKDOWN", type=Path, help="rewrite the block in MARKDOWN (e.g. docs/scenario-reference.md)")
    action.add_argument("--check", metavar="MARKDOWN", type=Path, help="exit 1 when the block in MARKDOWN is out of date")
    args = parser.parse_args(argv)
    path: Path | None = args.write or args.check
    if path is None:
        sys.stdout.write(scenario_reference())
        return 0
    try:
        markdown = path.read_text(encoding="utf-8")
        if args.write:
            path.write_text(with_reference(markdown), encoding="utf-8")
            return 0
        current = extract_reference(markdown)
    except (OSError, ValueError) as exc:
        print(f"error: {path}: {exc}", file=sys.stderr)
        return 2
    if current != scenario_reference():
        print(f"{path}: the scenario reference is out of date; run: {REGENERATE_COMMAND}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
