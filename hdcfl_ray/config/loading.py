"""Reading a scenario: YAML (SafeLoader only, with the limits of `safe_yaml`), `--set`
overrides, env-var expansion, and turning pydantic's errors into messages that name
the key path and the fix (user values in them are shortened)."""

from __future__ import annotations

import difflib
import os
import re
import types
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from hdcfl_ray.config.paths import check_path_lengths
from hdcfl_ray.config.ranges import check_integer_ranges
from hdcfl_ray.config.safe_yaml import YAMLLimitError, clip, load_yaml, shorten
from hdcfl_ray.config.schema import UNKNOWN_SECTION_KEY, Scenario
from hdcfl_ray.errors import ScenarioError

# A scenario is a few kilobytes; a file far larger is not one (and would be held in memory whole).
MAX_SCENARIO_BYTES = 4 * 1024 * 1024
MAX_KEY_PARTS = 16  # --set a.b.c...: no scenario key is nested deeper than a few sections

_ENV_PATTERN = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def read_scenario_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ScenarioError(f"{path}: no such scenario file")
    text = read_text_file(path, "a scenario is a YAML text file")
    try:
        raw = load_yaml(text)
    except YAMLLimitError as exc:
        raise ScenarioError(f"{path}: refused: {exc}") from None
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: not valid YAML: {exc}") from exc
    except RecursionError:
        raise ScenarioError(f"{path}: not valid YAML: nested too deeply") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ScenarioError(f"{path}: the top level must be a mapping of keys (name:, seed:, dataset:, ...)")
    return raw


def read_text_file(path: Path, what: str) -> str:
    """The UTF-8 text of `path`; a ScenarioError naming the file when it cannot be
    read or is not text (`what` says what the file should be)."""
    try:
        if path.stat().st_size > MAX_SCENARIO_BYTES:
            raise ScenarioError(
                f"{path}: {path.stat().st_size} bytes, more than a scenario can be ({MAX_SCENARIO_BYTES} bytes); {what}"
            )
        data = path.read_bytes()
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot be read ({exc.strerror or exc}); check that it is a readable file") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{path}: not a text file (byte {exc.start} is not UTF-8); {what}") from None
    if "\x00" in text:
        raise ScenarioError(f"{path}: not a text file (it holds NUL bytes); {what}")
    return text


def parse_override(text: str) -> tuple[list[str], Any]:
    """`dataset.root=/data` -> (["dataset", "root"], "/data"); the value is read as YAML."""
    key, sep, value_text = text.partition("=")
    key = key.strip()
    shown = shorten(text)
    if not sep or not key:
        raise ScenarioError(f"--set {shown}: expected KEY=VALUE, e.g. --set protocol.rounds=5")
    parts = key.split(".")
    if any(not part for part in parts) or len(parts) > MAX_KEY_PARTS:
        raise ScenarioError(f"--set {shown}: {shorten(key)} is not a dotted key path such as protocol.rounds")
    try:
        value = load_yaml(value_text) if value_text.strip() else None
    except YAMLLimitError as exc:
        raise ScenarioError(f"--set {shown}: the value is refused: {exc}") from None
    except yaml.YAMLError as exc:
        raise ScenarioError(f"--set {shown}: the value is not valid YAML: {clip(str(exc), 300)}") from None
    return parts, value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    merged = _deep_copy(raw)
    for text in overrides:
        parts, value = parse_override(text)
        node = merged
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = {}
                node[part] = child
            if not isinstance(child, dict):
                prefix = ".".join(parts[: depth + 1])
                raise ScenarioError(f"--set {shorten(text)}: {prefix} holds a value, not a section of keys")
            node = child
        node[parts[-1]] = value
    return merged


def expand_env(value: Any, key_path: str = "") -> Any:
    """Expand $VAR and ${VAR} in every string; an unset variable is an error naming the key."""
    if isinstance(value, dict):
        return {k: expand_env(v, f"{key_path}.{k}" if key_path else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_env(v, f"{key_path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, str):
        def replace(match: re.Match[str]) -> str:
            name = match.group(1) or match.group(2)
            if name not in os.environ:
                raise ScenarioError(
                    f"{key_path}: {shorten(value)} uses the environment variable {name}, which is not set "
                    f"(export {name}=... or override with --set {key_path}=...)"
                )
            return os.environ[name]

        return _ENV_PATTERN.sub(replace, value)
    return value


def build_scenario(raw: dict[str, Any], source: str = "scenario") -> Scenario:
    try:
        scenario = Scenario.model_validate(raw)
    except ValidationError as exc:
        raise ScenarioError(format_validation_error(exc, raw, source)) from None
    check_integer_ranges(scenario, source)
    check_path_lengths(scenario, source)
    return scenario


def load_scenario(path: str | Path, overrides: list[str] | None = None) -> Scenario:
    raw = read_scenario_file(path)
    raw = apply_overrides(raw, overrides or [])
    raw = expand_env(raw)
    return build_scenario(raw, source=str(path))


def format_validation_error(exc: ValidationError, raw: dict[str, Any], source: str) -> str:
    lines = [f"{source}: invalid scenario"]
    # A key whose type is a union (`clients_per_actor: int | "auto"`) fails once per
    # member, under locations such as `...clients_per_actor.int`: one line per key.
    by_key: dict[str, list[str]] = {}
    for error in exc.errors():
        location = [str(part) for part in error["loc"]]
        kind = error["type"]
        message = error["msg"].removeprefix("Value error, ")
        plugin_key = _UNKNOWN_SECTION_KEY.match(message)
        if plugin_key:  # a section that also holds plugins' sections refused a key it does not know
            kind, location = "extra_forbidden", [*_key_location(location), plugin_key.group(1)]
        if kind == "extra_forbidden":
            key_path = ".".join(location)
            section = ".".join(location[:-1])
            allowed = _allowed_keys(location[:-1], raw)
            where = f"in {section}" if section else "at the top level"
            hint = did_you_mean(location[-1], allowed)
            lines.append(f"  {clip(key_path)}: unknown key {where}{hint}; allowed keys: {', '.join(allowed)}")
            continue
        key_path = ".".join(_key_location(location))
        if kind == "missing":
            text = "required key is missing"
        elif kind == "literal_error":
            text = f"is not allowed; choose one of: {error.get('ctx', {}).get('expected', '')}"
        else:
            text = message
        by_key.setdefault(key_path, []).append(text)
    for key_path, texts in by_key.items():
        if not key_path:
            lines += [f"  {text}" for text in texts]
            continue
        if texts == ["required key is missing"]:
            lines.append(f"  {key_path}: required key is missing")
            continue
        value = _lookup(raw, key_path.split("."))
        shown = "" if value is _MISSING else f" {shorten(value)}"
        if len(texts) == 1 and texts[0].startswith("is not allowed"):
            hint = did_you_mean(value, _QUOTED.findall(texts[0])) if isinstance(value, str) else ""
            lines.append(f"  {key_path}:{shown} {texts[0]}{hint}")
        else:
            alternatives = "; or: ".join(text.removeprefix("is not allowed; ") for text in texts)
            # a name checked against a registry ("'fedprx' is not a method; choose from 'fedprox', ...")
            hint = did_you_mean(value, _QUOTED.findall(texts[0])[1:]) if isinstance(value, str) and "; choose from " in texts[0] else ""
            lines.append(f"  {key_path}:{shown}{':' if shown else ''} {alternatives}{hint}")
    return "\n".join(lines)


def _key_location(location: list[str]) -> list[str]:
    """The scenario keys of an error location, without the union-member tags pydantic
    appends (`int`, `literal['auto']`): the longest prefix that names schema keys."""
    model: Any = Scenario
    keys: list[str] = []
    for part in location:
        if isinstance(model, type) and issubclass(model, BaseModel) and part in model.model_fields:
            keys.append(part)
            model = _section_model(model.model_fields[part].annotation)
        elif part.isdigit() and keys:  # an item of a list key such as partition.angles
            keys.append(part)
            model = None
        else:
            break
    return keys


_MISSING = object()
_QUOTED = re.compile(r"'([^']*)'")
_UNKNOWN_SECTION_KEY = re.compile(rf"^(\S+): {re.escape(UNKNOWN_SECTION_KEY)}$")


def did_you_mean(typed: str, choices: list[str]) -> str:
    """` (did you mean 'batch_size'?)` for a near miss among `choices`, else empty."""
    close = difflib.get_close_matches(typed, choices, n=1, cutoff=0.7)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _lookup(raw: Any, location: list[str]) -> Any:
    node = raw
    for part in location:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def _allowed_keys(section: list[str], raw: dict[str, Any]) -> list[str]:
    from hdcfl_ray.config import schema

    model: Any = schema.Scenario
    for part in section:
        field = model.model_fields.get(part)
        model = None if field is None else _section_model(field.annotation)
        if model is None:
            return []
    return sorted(model.model_fields)


def _section_model(annotation: Any) -> type[BaseModel] | None:
    """The section a key's annotation holds: a model, or a model that may be null (an
    optional section such as `privacy`); None for a value."""
    members = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    models = [member for member in members if isinstance(member, type) and issubclass(member, BaseModel)]
    others = [member for member in members if member is not type(None) and member not in models]
    return models[0] if len(models) == 1 and not others else None


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value


def scenario_to_yaml(scenario: Scenario) -> str:
    return yaml.safe_dump(scenario.model_dump(mode="json"), sort_keys=False)
