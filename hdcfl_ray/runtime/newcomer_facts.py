"""What a run records and says of its newcomers (partition.newcomers): under the
manifest's "evaluation", which clients they are, the method's newcomer rule and the
budget; at start, a notice naming them and the rule (or its absence)."""

from __future__ import annotations

from typing import Any

from hdcfl_ray.algorithms.registry import newcomer_rule
from hdcfl_ray.config.schema import Scenario
from hdcfl_ray.contract import NO_NEWCOMER_RULE
from hdcfl_ray.data.partitions.newcomers import scenario_newcomers


def newcomer_facts(scenario: Scenario) -> dict[str, Any]:
    """{} for a run without newcomers, so its manifest is as before."""
    newcomers = scenario_newcomers(scenario)
    if not newcomers:
        return {}
    return {
        "newcomers": list(newcomers),
        "newcomer_rule": newcomer_rule(scenario.algorithm.name) or NO_NEWCOMER_RULE,
        "newcomer_epochs": scenario.protocol.newcomer_epochs,
    }


def newcomer_notices(scenario: Scenario) -> list[str]:
    """The line a run with newcomers prints at start ([] without newcomers)."""
    facts = newcomer_facts(scenario)
    if not facts:
        return []
    rule = facts["newcomer_rule"]
    scored = f"scored at every evaluated round by {scenario.algorithm.name}'s newcomer rule: {rule}"
    if rule == NO_NEWCOMER_RULE:
        scored = f"{scenario.algorithm.name} declares no newcomer rule: their rows in newcomers.parquet say so, with no scores"
    return [f"partition.newcomers: clients {facts['newcomers']} never train; {scored}"]
