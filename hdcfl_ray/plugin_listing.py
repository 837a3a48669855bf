"""What `hdcfl-ray plugins` prints: every method, partition, data source, transform
and encoder there is, built-in or from a plugin (with its package and version), and
the keys of each one's section."""

from __future__ import annotations

from typing import Any

from hdcfl_ray.plugins import KINDS, plugin_specs


_SECTIONS = {"methods": "algorithm", "partitions": "partition", "sources": "dataset"}


def _keys(section: str, name: str, params: Any) -> list[str]:
    from hdcfl_ray.contract.method import NoParams

    if params is NoParams:
        return []
    lines = []
    for key, field in params.model_fields.items():
        default = "required" if field.is_required() else repr(field.get_default(call_default_factory=True))
        lines.append(f"      {section}.{name}.{key} = {default}" + (f"  # {field.description}" if field.description else ""))
    return lines


def describe() -> str:
    """What `hdcfl-ray plugins` prints: per kind, every name (built-in or with its
    plugin's package and version), its summary and the keys of its section."""
    from hdcfl_ray.algorithms.registry import method_specs
    from hdcfl_ray.data.partitions.registry import partition_specs
    from hdcfl_ray.data.shifts import transform_specs
    from hdcfl_ray.data.sources.registry import source_specs

    from hdcfl_ray.config.schema import BUILTIN_ENCODERS

    every: dict[str, dict[str, Any]] = {
        "methods": method_specs(),
        "partitions": partition_specs(),
        "sources": source_specs(),
        "transforms": transform_specs(),
        "encoders": {**dict.fromkeys(BUILTIN_ENCODERS), **{name: spec for name, (spec, _) in plugin_specs("encoders").items()}},
    }
    lines: list[str] = []
    for kind, specs in every.items():
        plugins = plugin_specs(kind)
        lines.append(f"{kind} ({KINDS[kind][0]}):")
        for name, spec in specs.items():
            if name in plugins:
                origin = plugins[name][1]
                where = f"plugin {origin.package} {origin.version or '(no version)'}, {origin.module}"
            else:
                where = "built-in"
            summary = getattr(spec, "summary", "")
            lines.append(f"  {name}  [{where}]" + (f"  {summary}" if summary else ""))
            if kind in _SECTIONS and spec is not None:
                lines += _keys(_SECTIONS[kind], name, spec.params)
    return "\n".join(lines)
