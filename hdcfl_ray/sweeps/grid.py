"""Expanding a sweep into runs, each a fully validated scenario with its own folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hdcfl_ray.config.loading import apply_overrides, build_scenario, did_you_mean, expand_env, read_scenario_file
from hdcfl_ray.algorithms.registry import method_names
from hdcfl_ray.config.schema import Scenario
from hdcfl_ray.errors import ScenarioError


@dataclass(frozen=True)
class SweepRun:
    setting: str  # the scenario's name
    algorithm: str
    seed: int
    scenario: Scenario
    run_dir: Path

    @property
    def key(self) -> str:
        return f"{self.setting}/{self.algorithm}/seed{self.seed}"


@dataclass(frozen=True)
class SweepPlan:
    scenario_files: tuple[Path, ...]
    algorithms: tuple[str, ...] | None  # None: each scenario's own; ("all",): every method
    seeds: tuple[int, ...] | None  # None: each scenario's own
    overrides: tuple[str, ...]
    out: Path


def read_sweep_file(path: Path, out: Path | None) -> SweepPlan:
    """A sweep file: `scenarios: [files]`, optional `algorithms`, `seeds`, `set: {key: value}`, `out`."""
    raw = read_scenario_file(path)
    unknown = set(raw) - {"scenarios", "algorithms", "seeds", "set", "out"}
    if unknown:
        raise ScenarioError(f"{path}: unknown sweep key(s) {', '.join(sorted(unknown))}; allowed: scenarios, algorithms, seeds, set, out")
    scenarios = raw.get("scenarios")
    if not isinstance(scenarios, list) or not scenarios:
        raise ScenarioError(f"{path}: scenarios: give a list of scenario files")
    overrides = raw.get("set") or {}
    if not isinstance(overrides, dict):
        raise ScenarioError(f"{path}: set: give a mapping of key paths to values, e.g. {{protocol.rounds: 5}}")
    # paths in the file are relative to the file; --out is relative to where you are
    destination = out or ((path.parent / str(raw["out"])).resolve() if raw.get("out") else None)
    if destination is None:
        raise ScenarioError(f"{path}: no output folder: give --out SWEEP_DIR or `out:` in the file")
    return SweepPlan(
        scenario_files=tuple((path.parent / str(entry)).resolve() if not Path(str(entry)).is_absolute() else Path(str(entry)) for entry in scenarios),
        algorithms=_algorithm_list(raw.get("algorithms"), path),
        seeds=check_seeds(raw["seeds"], f"{path}: seeds") if raw.get("seeds") is not None else None,
        overrides=tuple(f"{key}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}" for key, value in overrides.items()),
        out=destination,
    )


def check_seeds(values: Any, where: str) -> tuple[int, ...]:
    """A sweep's seeds: a non-empty list of distinct integers in 0..2^31-1 (a float
    or a word is refused, never rounded: `1.7` is not seed 1)."""
    from hdcfl_ray.config.ranges import SEED_MAX
    from hdcfl_ray.config.safe_yaml import shorten

    if isinstance(values, (int, str)) and not isinstance(values, bool):
        values = [values]
    if not isinstance(values, (list, tuple)) or not values:
        raise ScenarioError(f"{where}: give a list of integer seeds, e.g. [42, 123, 2026]")
    seeds: list[int] = []
    for value in values:
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value.strip())
        if isinstance(value, bool) or not isinstance(value, int):
            raise ScenarioError(f"{where}: {shorten(value)} is not an integer seed; give integers, e.g. 42,123,2026")
        if not 0 <= value <= SEED_MAX:
            raise ScenarioError(f"{where}: {value} is outside 0..{SEED_MAX}")
        if value in seeds:
            raise ScenarioError(f"{where}: seed {value} is listed twice; give each seed once")
        seeds.append(value)
    return tuple(seeds)


def _algorithm_list(value: Any, path: Path) -> tuple[str, ...] | None:
    if not value:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise ScenarioError(f"{path}: algorithms: give a list of method names, or all")
    return tuple(value)


def resolve_algorithms(names: tuple[str, ...]) -> tuple[str, ...]:
    """`all` stands for every method there is (so a sweep picks up methods added later)."""
    known = method_names()
    resolved = [name for entry in names for name in (known if entry == "all" else (entry,))]
    unknown = [name for name in resolved if name not in known]
    if unknown:
        named = ", ".join(f"{name}{did_you_mean(name, list(known))}" for name in unknown)
        raise ScenarioError(f"--algorithms: {named} unknown; choose from {', '.join(known)}, or all")
    return tuple(dict.fromkeys(resolved))


def parse_list(text: str | None, option: str) -> tuple[str, ...] | None:
    if text is None:
        return None
    items = tuple(part.strip() for part in text.split(",") if part.strip())
    if not items:
        raise ScenarioError(f"{option}: give a comma-separated list")
    return items


def expand(plan: SweepPlan) -> list[SweepRun]:
    """Every (scenario, algorithm, seed) as a validated scenario; errors name the run."""
    chosen = resolve_algorithms(plan.algorithms) if plan.algorithms is not None else None
    runs: list[SweepRun] = []
    seen: set[str] = set()
    for path in plan.scenario_files:
        base = apply_overrides(read_scenario_file(path), list(plan.overrides))
        algorithms = chosen or (str(base.get("algorithm", {}).get("name")),)
        label = (base.get("output") or {}).get("label")
        if label and len(algorithms) > 1:
            raise ScenarioError(
                f"{path}: output.label {label!r} names one method's variant, and this sweep runs {len(algorithms)} methods "
                f"({', '.join(algorithms)}): reports would list them all under one name. Give the labelled variant a sweep "
                "of its own (--algorithms with one method)"
            )
        seeds = plan.seeds or (int(base.get("seed", 42)),)
        for algorithm in algorithms:
            for seed in seeds:
                raw: dict[str, Any] = apply_overrides(base, [f"algorithm.name={algorithm}", f"seed={seed}"])
                scenario = build_scenario(expand_env(raw), source=f"{path} (algorithm {algorithm}, seed {seed})")
                run = SweepRun(scenario.name, algorithm, seed, scenario, plan.out / scenario.name / algorithm / f"seed{seed}")
                if run.key in seen:
                    raise ScenarioError(f"{path}: two scenarios are named {scenario.name!r}; give each scenario its own name")
                seen.add(run.key)
                runs.append(run)
    return runs
