"""Errors a user can cause. The CLI maps ScenarioError to exit code 2."""


class ScenarioError(Exception):
    """Bad input: a scenario key, an override, a missing data file. The message
    names where the problem is and what to do."""
