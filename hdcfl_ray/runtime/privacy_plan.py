"""The scenario's `privacy:` section resolved for a run (`ResolvedPrivacy`): q from the
client counts (known once the data is read), z from privacy.target_epsilon and the
method's planned releases, the adaptive clip's noise split; what the run says of it at
start and records in its manifest. Called where the run is prepared (preflight.py);
everything here that a user can cause is a ScenarioError naming the key (exit 2),
a missing accountant (the `dp` extra) included."""

from __future__ import annotations

import math
from typing import Any, Sequence, get_args

from hdcfl_ray.algorithms.registry import method_spec
from hdcfl_ray.config.schema import Scenario, method_params
from hdcfl_ray.contract import PrivacyConfig, PrivacyRule, ResolvedAdaptiveClip, ResolvedPrivacy
from hdcfl_ray.contract.privacy import Accountant, PlannedRelease, Release
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.runtime.server.privacy_ledger import compacted, spent_epsilon


def resolve_privacy(scenario: Scenario) -> tuple[ResolvedPrivacy | None, list[str]]:
    """The privacy a run of `scenario` (partition.num_clients counted) computes with, and the
    lines it prints at start; (None, []) without a privacy section."""
    config = scenario.privacy
    if config is None:
        return None, []
    rule = method_spec(scenario.algorithm.name).privacy
    if rule is None:  # the scenario check refuses this first; a plugin unloaded since would land here
        raise ScenarioError(f"privacy: algorithm.name: {scenario.algorithm.name} declares no privacy rule; remove the privacy section")
    if config.sampling == "poisson":
        _check_no_availability_windows(scenario)
    training = scenario.partition.client_count() - scenario.partition.newcomer_count()
    per_round = min(scenario.clients_per_round(), training)
    poisson_rate = per_round / training
    sample_rate = poisson_rate if config.sampling == "poisson" else 1.0
    rounds = scenario.protocol.rounds
    params = method_params(scenario.algorithm)
    plan = round_plan(rule, params, rounds)
    noise_multiplier = config.noise_multiplier
    if noise_multiplier is None:
        assert config.target_epsilon is not None  # PrivacyConfig holds exactly one of them
        noise_multiplier = _noise_for_target(config, rule.planned_releases(params, rounds, rounds), sample_rate, rounds)
    resolved = ResolvedPrivacy(
        noise_multiplier=noise_multiplier,
        clip=config.clip,
        sampling=config.sampling,
        sample_rate=sample_rate,
        expected_cohort=poisson_rate * training,
        training_clients=training,
        rounds=rounds,
        delta=config.delta,
        accountant=config.accountant,
        noise_cohort_size=config.noise_cohort_size,
        adaptive_clip=_adaptive_clip(config, noise_multiplier, poisson_rate * training),
        max_epsilon=config.max_epsilon,
        min_group_size=config.min_group_size,
        target_epsilon=config.target_epsilon,
        round_plan=plan,
    )
    return resolved, _notices(resolved, rule.planned_releases(params, rounds, rounds))


def round_plan(rule: PrivacyRule, params: Any, rounds: int) -> tuple[tuple[PlannedRelease, ...], ...]:
    """Each round's share of the rule's planned releases: those of its first r rounds less
    those of its first r - 1, per noise scale."""
    def steps_by_scale(planned: Sequence[PlannedRelease]) -> dict[float, int]:
        steps: dict[float, int] = {}
        for scale, count in planned:
            steps[float(scale)] = steps.get(float(scale), 0) + int(count)
        return steps

    plan = []
    before = steps_by_scale(rule.planned_releases(params, 0, rounds))
    for round_index in range(1, rounds + 1):
        now = steps_by_scale(rule.planned_releases(params, round_index, rounds))
        if any(now.get(scale, 0) < count for scale, count in before.items()):
            raise ValueError(f"a privacy rule's planned releases must only grow with the rounds (round {round_index} has fewer)")
        added = tuple((scale, count - before.get(scale, 0)) for scale, count in now.items() if count > before.get(scale, 0))
        plan.append(added)
        before = now
    return tuple(plan)


def _noise_for_target(config: PrivacyConfig, planned: Sequence[PlannedRelease], sample_rate: float, rounds: int) -> float:
    from hdcfl_ray.privacy.accountant import noise_for_target

    plan = [(float(scale), sample_rate, int(steps)) for scale, steps in planned if steps > 0]
    try:  # without Opacus (the dp extra): PrivacyExtraMissing, a ScenarioError naming it
        return noise_for_target(config.target_epsilon, plan, config.delta, config.accountant)
    except ValueError as exc:
        raise ScenarioError(
            f"privacy.target_epsilon: {config.target_epsilon:g} cannot be reached over protocol.rounds: {rounds} at sample "
            f"rate q = {sample_rate:.4g} and privacy.delta: {config.delta:g} ({exc}): raise privacy.target_epsilon, run fewer "
            "rounds, or sample fewer clients per round"
        ) from None


def _adaptive_clip(config: PrivacyConfig, noise_multiplier: float, expected_cohort: float) -> ResolvedAdaptiveClip | None:
    adaptive = config.adaptive_clip
    if adaptive is None or noise_multiplier == 0.0:  # a method that releases nothing (local) clips nothing
        return None
    count_noise = adaptive.count_noise_multiplier if adaptive.count_noise_multiplier is not None else expected_cohort / 20.0
    # the update and the count are one Gaussian mechanism of multiplier z when
    # z_update^-2 + (2 sigma_b)^-2 = z^-2 (Andrew et al. 2021): the count takes its share
    if 2.0 * count_noise <= noise_multiplier:
        given = (
            f"privacy.adaptive_clip.count_noise_multiplier: {count_noise:g}"
            if adaptive.count_noise_multiplier is not None
            else f"privacy.adaptive_clip.count_noise_multiplier: null (= {expected_cohort:.3g} expected clients per round / 20 = {count_noise:.3g})"
        )
        raise ScenarioError(
            f"{given} leaves the update no noise: the count's noise 2 x sigma_b = {2 * count_noise:.3g} must exceed z = "
            f"{noise_multiplier:.3g} (the update's own multiplier is (z^-2 - (2 sigma_b)^-2)^-1/2): give a larger "
            "count_noise_multiplier, or remove privacy.adaptive_clip (a fixed clip)"
        )
    from hdcfl_ray.privacy.adaptive_clipping import value_noise_multiplier

    return ResolvedAdaptiveClip(
        target_quantile=adaptive.target_quantile,
        learning_rate=adaptive.learning_rate,
        count_noise_std=count_noise,
        update_noise_multiplier=value_noise_multiplier(noise_multiplier, count_noise),
    )


def _check_no_availability_windows(scenario: Scenario) -> None:
    """Poisson sampling's amplification assumes every training client may join every round:
    a trace's availability windows would keep some out."""
    system = scenario.protocol.system
    if system.trace is None:
        return
    from hdcfl_ray.runtime.server.virtual_clock import client_profiles

    profiles = client_profiles(system, scenario.partition.client_count(), scenario.seed)
    if any(profile.available_from > 0.0 or math.isfinite(profile.available_until) for profile in profiles):
        raise ScenarioError(
            f"privacy.sampling: poisson with protocol.system.trace: {system.trace}, whose available_from / available_until "
            "keep clients out of some rounds; the accountant's amplification assumes each client may join every round with "
            "rate q: remove the availability columns from the trace, or set privacy.sampling: fixed (q = 1, no amplification)"
        )


def _notices(privacy: ResolvedPrivacy, planned: Sequence[PlannedRelease]) -> list[str]:
    whole_run = [(privacy.noise_multiplier * scale, privacy.sample_rate, int(steps)) for scale, steps in planned if steps > 0]
    planned_epsilon = _checked_epsilon(whole_run, privacy)
    chosen = f" (chosen for privacy.target_epsilon: {privacy.target_epsilon:g})" if privacy.target_epsilon is not None else ""
    sampled = (
        f"Poisson sampling at q = {privacy.sample_rate:.4g} ({privacy.expected_cohort:.3g} of {privacy.training_clients} "
        "clients per round on average)"
        if privacy.sampling == "poisson"
        else "fixed-size sampling, accounted with q = 1 (no amplification claimed)"
    )
    lines = [
        f"privacy: z = {privacy.noise_multiplier:.4g}{chosen}, clip C = {privacy.clip:g}"
        f"{' (adaptive)' if privacy.adaptive_clip is not None else ''}, {sampled}: the {privacy.rounds} planned rounds "
        f"reach epsilon = {planned_epsilon:.3g} at delta = {privacy.delta:g} ({privacy.accountant})"
    ]
    first_round = privacy.planned_releases(1)
    if privacy.max_epsilon is not None:
        first = _checked_epsilon(first_round, privacy)
        if first > privacy.max_epsilon:
            raise ScenarioError(
                f"privacy.max_epsilon: {privacy.max_epsilon:g} is below the epsilon of round 1's release alone ({first:.3g} at "
                f"delta {privacy.delta:g}): raise privacy.max_epsilon, or add noise (privacy.noise_multiplier / target_epsilon)"
            )
        if planned_epsilon > privacy.max_epsilon:
            lines.append(
                f"privacy.max_epsilon: {privacy.max_epsilon:g}: the run stops before the round whose release would pass it "
                f"(the {privacy.rounds} planned rounds would reach {planned_epsilon:.3g})"
            )
    if privacy.delta >= 1.0 / privacy.training_clients:
        lines.append(
            f"privacy.delta: {privacy.delta:g} is not below 1 / {privacy.training_clients} training clients: a guarantee "
            "at this delta allows one client's data to leak whole; pick a smaller delta"
        )
    if privacy.noise_cohort_size is not None:
        lines.append(
            f"privacy.noise_cohort_size: {privacy.noise_cohort_size}: the noise is that of rounds of {privacy.noise_cohort_size} "
            f"clients (the simulated rounds train {privacy.expected_cohort:.3g} on average); the epsilon holds for a "
            f"deployment of {privacy.training_clients / privacy.noise_cohort_factor:.4g} clients sampled at the same q"
        )
    return lines


def _checked_epsilon(releases: Sequence[Release], privacy: ResolvedPrivacy) -> float:
    """spent_epsilon, with an accountant's refusal (e.g. prv outside its domain) named as the user's key."""
    try:
        return spent_epsilon(releases, privacy.delta, privacy.accountant)
    except (ValueError, ArithmeticError) as exc:
        raise ScenarioError(
            f"privacy.accountant: {privacy.accountant} cannot account this run's releases ({exc}): use privacy.accountant: rdp"
        ) from None


def privacy_record(privacy: ResolvedPrivacy) -> dict[str, Any]:
    """What the manifest records of the privacy a run computes with (under "privacy")."""
    adaptive = privacy.adaptive_clip
    return {
        "noise_multiplier": privacy.noise_multiplier,
        "target_epsilon": privacy.target_epsilon,
        "clip": privacy.clip,
        "adaptive_clip": None
        if adaptive is None
        else {
            "target_quantile": adaptive.target_quantile,
            "learning_rate": adaptive.learning_rate,
            "count_noise_std": adaptive.count_noise_std,
            "update_noise_multiplier": adaptive.update_noise_multiplier,
        },
        "sampling": privacy.sampling,
        "sample_rate": privacy.sample_rate,
        "expected_cohort": privacy.expected_cohort,
        "training_clients": privacy.training_clients,
        "rounds": privacy.rounds,
        "delta": privacy.delta,
        "accountant": privacy.accountant,
        "noise_cohort_size": privacy.noise_cohort_size,
        "noise_cohort_factor": privacy.noise_cohort_factor,
        "max_epsilon": privacy.max_epsilon,
        "min_group_size": privacy.min_group_size,
    }


def spent_record(privacy: ResolvedPrivacy, releases: Sequence[Release], rounds_run: int, stopped: str | None) -> dict[str, Any]:
    """What the manifest adds at the end of a run: the epsilon its releases spent, by the
    configured accountant and by both where each can (RDP is the guarantee, PRV an estimate)."""
    by_accountant: dict[str, float | None] = {}
    problems: dict[str, str] = {}
    for accountant in get_args(Accountant):
        try:
            by_accountant[accountant] = spent_epsilon(releases, privacy.delta, accountant)
        except (ValueError, ArithmeticError, MemoryError) as exc:  # PRV's numerical domain; its grid for a tiny z outgrows memory
            by_accountant[accountant], problems[accountant] = None, str(exc)
    return {
        "epsilon": by_accountant[privacy.accountant],
        "epsilon_rdp": by_accountant["rdp"],
        "epsilon_prv": by_accountant["prv"],
        **({"epsilon_not_computed": problems} if problems else {}),
        "releases": [list(release) for release in compacted(releases)],
        "rounds_run": rounds_run,
        "stopped_at_privacy_budget": stopped,
    }
