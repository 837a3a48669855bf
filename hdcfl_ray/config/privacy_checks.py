"""Where the scenario's `privacy:` section cannot apply: what the scenario check says,
naming the keys and the fix. What needs the data (the client count behind q, a trace's
availability windows) and the accountant is checked where the run is prepared
(runtime/privacy_plan.py)."""

from __future__ import annotations

from hdcfl_ray.contract import PrivacyConfig

_REMOVE = "remove the privacy section"


def privacy_problem(
    privacy: PrivacyConfig | None,
    method: str,
    accepts: bool,
    accepting: list[str],
    mode: str,
    straggler_policy: str,
    availability: str,
    reason: str = "",
) -> str | None:
    """What is wrong with running `method` under `privacy` in this scenario, or None.
    `accepts`: the method's MethodSpec declares a privacy rule; `accepting`: the methods that do;
    `reason`: why the method has none (MethodSpec.no_privacy_reason)."""
    if privacy is None:
        return None
    if not accepts:
        choices = f"one of the methods that accept it ({', '.join(accepting)})" if accepting else "a method that accepts it (none does yet)"
        why = reason or "its MethodSpec declares no privacy rule, so nothing says what it would clip and noise"
        return (
            f"privacy with algorithm.name: {method}, a method that does not run under client-level differential privacy "
            f"({why}): {_REMOVE}, or choose {choices}"
        )
    if mode == "async":
        return (
            "privacy with protocol.mode: async; the accountant composes one noised release per synchronous round of sampled "
            f"clients, and an asynchronous server applies updates one by one as they land: set protocol.mode: sync, or {_REMOVE}"
        )
    if privacy.sampling == "poisson" and straggler_policy != "wait_all":
        return (
            f"privacy.sampling: poisson with protocol.stragglers.policy: {straggler_policy}; the accountant's amplification "
            "assumes each client joins a round with rate q, and leaving out late clients makes joining depend on speed: "
            "set protocol.stragglers.policy: wait_all, or privacy.sampling: fixed (accounted with q = 1, no amplification claimed)"
        )
    if privacy.sampling == "poisson" and availability != "always":
        return (
            f"privacy.sampling: poisson with protocol.availability.kind: {availability}; the accountant's amplification assumes "
            "each client joins a round with rate q, and clients offline in a round could not: set protocol.availability.kind: "
            "always, or privacy.sampling: fixed (accounted with q = 1, no amplification claimed)"
        )
    return None
