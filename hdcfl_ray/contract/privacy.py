"""Client-level differential privacy (DP-FedAvg, docs/privacy.md): the scenario's
`privacy:` section, what a run computes with once it is resolved (`ResolvedPrivacy`,
handed to a method in `RunInfo.privacy`), and what a method declares it sends through
the mechanism (`PrivacyRule`, its `MethodSpec.privacy`). The maths (clipping, the noised
sum, adaptive clipping, the accountant) is hdcfl_ray/privacy/.

A release is `(noise_multiplier, sample_rate, steps)`: `steps` applications of the
Gaussian mechanism whose noise std is `noise_multiplier` times the L2 bound of one
client's contribution, each over clients sampled with rate `sample_rate`: what the
accountant composes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal

from pydantic import Field, model_validator

from hdcfl_ray.contract.section import Section

Sampler = Literal["poisson", "fixed"]
Accountant = Literal["rdp", "prv"]
# (noise multiplier, sample rate, steps): what the accountant composes
Release = tuple[float, float, int]
# (noise scale, steps): a release planned before z is known; its multiplier is z * noise scale
PlannedRelease = tuple[float, int]


class AdaptiveClipConfig(Section):
    """Andrew et al. (2021), "Differentially private learning with adaptive clipping":
    the clip follows a quantile of the clients' update norms, learned from a noised count."""

    target_quantile: float = Field(
        0.5, gt=0.0, lt=1.0, description="gamma, the share of a round's clients whose update should lie within the clip"
    )
    learning_rate: float = Field(
        0.2, gt=0.0, description="eta_C of the geometric step C <- C exp(-eta_C (b - gamma)), b the noised share under the clip"
    )
    count_noise_multiplier: float | None = Field(
        None,
        gt=0.0,
        description="sigma_b, the std of the Gaussian noise on the count of clients under the clip; null = the expected "
        "clients per round / 20 (Andrew et al.'s recommendation); the update's own noise is then lowered so that both "
        "together cost what privacy's noise multiplier alone would",
    )


class PrivacyConfig(Section):
    """The scenario's `privacy:` section; absent = no privacy."""

    noise_multiplier: float | None = Field(
        None,
        gt=0.0,
        description="z: the noise on a round's sum of clipped updates has std z * clip; give this or target_epsilon, not both",
    )
    target_epsilon: float | None = Field(
        None,
        gt=0.0,
        description="the epsilon the planned rounds may spend: the run chooses z so that protocol.rounds rounds at "
        "sample rate q reach it at delta (within 0.01); give this or noise_multiplier, not both",
    )
    delta: float = Field(
        1.0e-5, gt=0.0, lt=1.0, description="delta of the (epsilon, delta) guarantee; pick it below 1 / partition.num_clients"
    )
    clip: float = Field(
        1.0,
        gt=0.0,
        description="C, the L2 bound on each client's update over the flat vector of everything it sends (the initial "
        "bound with adaptive_clip)",
    )
    adaptive_clip: AdaptiveClipConfig | None = Field(
        None, description="follow a quantile of the update norms instead of a fixed clip (Andrew et al. 2021); null = fixed clip"
    )
    sampling: Sampler = Field(
        "poisson",
        description="poisson: each training client joins a round independently with rate q = clients per round / training "
        "clients, the sampling the accountant's amplification assumes; fixed: protocol.participation's fixed-size sample, "
        "accounted with q = 1 (no amplification claimed)",
    )
    noise_cohort_size: int | None = Field(
        None,
        ge=1,
        description="calibrate the noise as if this many clients were in each round (pfl-research's noise cohort): the sum's "
        "noise is scaled by expected clients per round / this, the simulated cohort stays protocol.participation; every "
        "record states it; null = the simulated cohort",
    )
    accountant: Accountant = Field(
        "rdp",
        description="rdp: Renyi DP (Mironov et al.), an upper bound: the guarantee; prv: privacy random variables (Gopi et "
        "al.), a tighter numerical estimate; the manifest records both where it can",
    )
    max_epsilon: float | None = Field(
        None,
        gt=0.0,
        description="the run stops before the round whose release would take epsilon past this, saying so (the manifest "
        "records the round and the epsilon reached); null = run every round",
    )
    min_group_size: int = Field(
        1, ge=1, description="methods that release one noised sum per group (cluster): a group with fewer clients releases nothing"
    )

    @model_validator(mode="after")
    def _one_noise_setting(self) -> "PrivacyConfig":
        given = [key for key in ("noise_multiplier", "target_epsilon") if getattr(self, key) is not None]
        if len(given) != 1:
            what = "both are given" if given else "neither is given"
            raise ValueError(
                f"privacy.noise_multiplier and privacy.target_epsilon: give exactly one ({what}): noise_multiplier sets "
                "z itself, target_epsilon lets the run choose z for its planned rounds"
            )
        return self


@dataclass(frozen=True)
class ResolvedAdaptiveClip:
    """Adaptive clipping as a run computes with it."""

    target_quantile: float
    learning_rate: float
    count_noise_std: float  # sigma_b, resolved (null in the scenario: expected clients per round / 20)
    # z_update = (z^-2 - (2 sigma_b)^-2)^(-1/2): the update's noise multiplier, so that the update and the
    # count together are one Gaussian mechanism of multiplier z (Andrew et al. 2021, Theorem 1)
    update_noise_multiplier: float


@dataclass(frozen=True)
class ResolvedPrivacy:
    """What a run with a `privacy:` section computes with, resolved where the run is
    prepared (z from target_epsilon, q from the client counts): `RunInfo.privacy`."""

    noise_multiplier: float  # z
    clip: float  # C (with adaptive_clip: the initial clip)
    sampling: Sampler
    # q the accountant uses: poisson, clients per round / training clients; fixed, 1 (no amplification claimed)
    sample_rate: float
    expected_cohort: float  # the clients a round trains on average (poisson: q * training clients)
    training_clients: int  # the clients sampling draws from (partition.newcomers never train)
    rounds: int  # T, the planned rounds
    delta: float
    accountant: Accountant
    noise_cohort_size: int | None = None
    adaptive_clip: ResolvedAdaptiveClip | None = None
    max_epsilon: float | None = None
    min_group_size: int = 1
    target_epsilon: float | None = None  # as the scenario asked, when z was chosen for it
    # what the method's rule plans for each round, round 1 first: (noise scale, steps) pairs
    round_plan: tuple[tuple[PlannedRelease, ...], ...] = ()

    @property
    def noise_cohort_factor(self) -> float:
        """The share of z * C a round's sum gets: expected clients per round / noise_cohort_size
        with a noise cohort (its mean then has the noise of a cohort of that size), else 1."""
        return 1.0 if self.noise_cohort_size is None else self.expected_cohort / self.noise_cohort_size

    @property
    def update_noise_multiplier(self) -> float:
        """The multiplier of an update's release: z, or with adaptive clipping the update's
        share of it (Andrew et al.), so that the update and the count are one mechanism of z."""
        return self.noise_multiplier if self.adaptive_clip is None else self.adaptive_clip.update_noise_multiplier

    def sum_noise_std(self, clip: float | None = None) -> float:
        """The std of the Gaussian noise on a round's sum of clipped updates: the update's
        multiplier times `clip` (default the configured C; with adaptive clipping, the
        round's current clip) times `noise_cohort_factor`."""
        return self.update_noise_multiplier * (self.clip if clip is None else clip) * self.noise_cohort_factor

    def release(self, noise_scale: float = 1.0, steps: int = 1) -> Release:
        """The release a method reports (RoundNotes.releases) for `steps` noised sums at
        multiplier z * `noise_scale`, over this run's sample."""
        return (self.noise_multiplier * noise_scale, self.sample_rate, steps)

    def planned_releases(self, round_index: int) -> tuple[Release, ...]:
        """The releases the method's rule plans for round `round_index` (1-based)."""
        if not 1 <= round_index <= len(self.round_plan):
            return ()
        return tuple(self.release(scale, steps) for scale, steps in self.round_plan[round_index - 1])


def one_release_per_round(params: Any, rounds: int, total_rounds: int) -> tuple[PlannedRelease, ...]:
    """The default plan: one noised release of the shared model per round, at z."""
    return ((1.0, rounds),)


@dataclass(frozen=True)
class PrivacyRule:
    """What a method sends under client-level DP (its `MethodSpec.privacy`; None there: the
    method refuses a `privacy:` section). Listed in docs/privacy.md's table."""

    sends: str  # one line: what goes through the mechanism (clipped, summed, noised)
    kept_on_client: str = ""  # what stops leaving the client under DP (a head, a descriptor), one line
    # (the method's params section, rounds, total rounds) -> the (noise scale, steps) releases
    # of the first `rounds` rounds of a run of `total rounds` (a schedule may depend on it):
    # each a noised sum at multiplier z * noise scale. The run turns them into the
    # accountant's plan with its q (target_epsilon), and a round's share of them (rounds r
    # less rounds r - 1) into the release it checks privacy.max_epsilon against
    planned_releases: Callable[[Any, int, int], tuple[PlannedRelease, ...]] = one_release_per_round
