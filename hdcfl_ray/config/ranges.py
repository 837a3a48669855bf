"""Integer keys within the range the code can use.

The schema says what an integer means (`ge=1` for a count); this module says
how large it can be. Seeds feed numpy's SeedSequence (non-negative only),
torch's generator and scikit-learn's k-means (`random_state` below 2^32, and
HDC-FL adds the refresh index to the seed), so a seed lies in 0..2^31-1 and
leaves room for those offsets. Every other integer reaches torch or numpy as a
C int at some point (thread counts, sizes, loop bounds), so it stays below 2^31.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from hdcfl_ray.errors import ScenarioError

SEED_MAX = 2**31 - 1
INT_MAX = 2**31 - 1


def check_integer_ranges(scenario: BaseModel, source: str = "scenario") -> None:
    """Raise ScenarioError listing every integer key outside what the code can use."""
    problems = [*_seed_problems(getattr(scenario, "seed", 0)), *_integer_problems(scenario, "")]
    if problems:
        raise ScenarioError("\n".join([f"{source}: invalid scenario", *problems]))


def _seed_problems(seed: Any) -> list[str]:
    if isinstance(seed, int) and not 0 <= seed <= SEED_MAX:
        return [f"  seed: {seed} is outside 0..{SEED_MAX} (a seed is a non-negative integer below 2^31, e.g. 42)"]
    return []


def _integer_problems(model: BaseModel, prefix: str) -> list[str]:
    problems: list[str] = []
    for name in type(model).model_fields:
        value = getattr(model, name)
        key = f"{prefix}{name}"
        if isinstance(value, BaseModel):
            problems += _integer_problems(value, f"{key}.")
        elif isinstance(value, int) and not isinstance(value, bool) and key != "seed" and abs(value) > INT_MAX:
            problems.append(f"  {key}: {value} is too large; integers here must be below 2^31 ({INT_MAX})")
    return problems
