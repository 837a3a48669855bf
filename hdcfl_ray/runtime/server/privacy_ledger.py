"""The privacy a synchronous run has spent (the scenario's `privacy:` section): every
release its method reported (RoundNotes.releases), the epsilon they compose to after
each round, and whether the next round's planned release would pass
privacy.max_epsilon. The releases travel in the server's checkpoint, so a resumed run
reports the same epsilons. The accountant is hdcfl_ray/privacy/accountant.py."""

from __future__ import annotations

from typing import Sequence

from hdcfl_ray.contract import ResolvedPrivacy
from hdcfl_ray.contract.privacy import Accountant, Release

def compacted(releases: Sequence[Sequence[float]]) -> list[Release]:
    """`releases` with the steps of each (noise multiplier, sample rate) summed, in first-seen order."""
    steps: dict[tuple[float, float], int] = {}
    for multiplier, rate, count in releases:
        key = (float(multiplier), float(rate))
        steps[key] = steps.get(key, 0) + int(count)
    return [(multiplier, rate, count) for (multiplier, rate), count in steps.items() if count > 0]


def spent_epsilon(releases: Sequence[Sequence[float]], delta: float, accountant: Accountant) -> float:
    """The epsilon at `delta` of every release in `releases` composed (0 for none), as
    `accountant` ("rdp" or "prv") computes it (hdcfl_ray/privacy/accountant.py)."""
    combined = compacted(releases)
    if not combined:
        return 0.0
    # Opacus is imported on the first epsilon: without the dp extra, PrivacyExtraMissing (a
    # ScenarioError naming it) stops the run where it is prepared, before any round
    from hdcfl_ray.privacy.accountant import epsilon

    return epsilon(combined, delta, accountant)


class PrivacyLedger:
    def __init__(self, privacy: ResolvedPrivacy) -> None:
        self.privacy = privacy
        self.releases: list[Release] = []  # compacted: the accountant sees only the multiset
        self.epsilon = 0.0  # of `releases`, by privacy.accountant

    def record(self, releases: Sequence[Sequence[float]]) -> float:
        """Add a round's releases; the epsilon spent so far."""
        if releases:
            self.releases = compacted([*self.releases, *releases])
            self.epsilon = spent_epsilon(self.releases, self.privacy.delta, self.privacy.accountant)
        return self.epsilon

    def stop_before(self, round_index: int) -> str | None:
        """Why the run must end before round `round_index` (its planned release would take
        epsilon past privacy.max_epsilon), or None."""
        limit = self.privacy.max_epsilon
        planned = self.privacy.planned_releases(round_index)
        if limit is None or not planned:
            return None
        after = spent_epsilon([*self.releases, *planned], self.privacy.delta, self.privacy.accountant)
        if after <= limit:
            return None
        return (
            f"privacy.max_epsilon: the run stops after round {round_index - 1} at epsilon = {self.epsilon:.4g}: round "
            f"{round_index}'s release would take it to {after:.4g}, past {limit:g} (delta {self.privacy.delta:g}, {self.privacy.accountant})"
        )

    def snapshot(self) -> list[Release]:
        return list(self.releases)

    def restore(self, releases: Sequence[Sequence[float]]) -> None:
        self.releases = compacted(releases)
        self.epsilon = spent_epsilon(self.releases, self.privacy.delta, self.privacy.accountant)
