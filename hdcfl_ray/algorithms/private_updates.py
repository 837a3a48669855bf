"""What a method sends, and what its server makes of it, under a `privacy` section
(DP-FedAvg, docs/privacy.md): shared by every method that accepts privacy.

Client side: the client never uploads a model. It uploads its update, the trained model
minus the model it started from, clipped to L2 norm C over the flat vector of everything
it shares (`clipped_update`), and one bit, whether the update was within C (adaptive
clipping counts them). Server side: the mean of a round's clipped updates plus Gaussian
noise (`released_mean`), or one noised sum per group with a noised count (`released_group_means`,
for methods whose clients each join one cluster or group; `released_per_group_means`,
for methods whose clients spread a unit of weight over the groups). Every release is one
Gaussian mechanism the run's accountant counts: the method reports it in RoundNotes.releases.

The noise comes from the run's seeded stream of the round and the release (`noise_stream`),
so a rerun and a resume give the same bits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from hdcfl_ray import seeding
from hdcfl_ray.contract import ModelParams, ResolvedPrivacy, Upload
from hdcfl_ray.maths.server_optimizer import ServerMoments, ServerOptimizerConfig, server_step_clusters
from hdcfl_ray.privacy.adaptive_clipping import AdaptiveClip, next_clip, noisy_unclipped_fraction
from hdcfl_ray.privacy.clipping import clip_parts
from hdcfl_ray.privacy.gaussian_sum import noised_sum, private_mean

UPDATE = "update"  # Upload.models key of a clipped update (ModelParams: the encoder part, and the head part if shared)
WITHIN_CLIP = "within_clip"  # Upload.values key: 1 when the update's norm before clipping was at most C


@dataclass
class ClipState:
    """The clip the clients use this round: C, or adaptive clipping's current value
    (a field of the method's server state, so checkpoints keep it)."""

    clip: float


# release slots: each noised release of a round draws from its own stream
SLOT_MEAN, SLOT_GROUPS, SLOT_COUNT, SLOT_DESCRIPTORS = 0, 1, 2, 3


def noise_stream(seed: int, round_index: int, slot: int) -> np.random.Generator:
    """The noise of release `slot` at `round_index`: its own named stream of the run seed."""
    return seeding.rng(seed, "privacy_noise", round_index, slot)


def clipped_update(start: ModelParams, trained: ModelParams, clip: float, with_head: bool) -> tuple[ModelParams, float]:
    """trained - start over the encoder (and the head when it is shared), clipped to L2 norm
    `clip` over their concatenation, and the norm before clipping; a non-finite update (its
    training diverged) is sent as zeros, with norm infinity."""
    parts = [np.asarray(trained.encoder, np.float32) - np.asarray(start.encoder, np.float32)]
    if with_head:
        if trained.head is None or start.head is None:
            raise ValueError("a shared head's update needs a head in both models")
        parts.append(np.asarray(trained.head, np.float32) - np.asarray(start.head, np.float32))
    if not all(np.isfinite(part).all() for part in parts):
        # training diverged (a NaN or infinite weight): the client adds nothing to the sum, as
        # a client left out would, and counts as outside the clip; the noise is released alike
        zeros = [np.zeros_like(part, dtype=np.float32) for part in parts]
        return ModelParams(encoder=zeros[0], head=zeros[1] if with_head else None), math.inf
    clipped, norm = clip_parts(parts, clip)
    return ModelParams(encoder=clipped[0], head=clipped[1] if with_head else None), norm


def private_upload(
    client_id: int, num_samples: int, train_loss: float, steps: int, update: ModelParams, norm: float, clip: float, **values: object
) -> Upload:
    """The upload of a client under privacy: its clipped update and the within-clip bit,
    never a model."""
    return Upload(
        client_id=client_id,
        num_samples=num_samples,
        train_loss=train_loss,
        steps=steps,
        models={UPDATE: update},
        values={WITHIN_CLIP: int(norm <= clip), **values},
    )


def _flat(update: ModelParams) -> np.ndarray:
    return update.encoder if update.head is None else np.concatenate([update.encoder, update.head])


def _unflat(vector: np.ndarray, like: ModelParams) -> ModelParams:
    size = int(np.size(like.encoder))
    if like.head is None:
        return ModelParams(encoder=np.asarray(vector, np.float32))
    return ModelParams(encoder=np.asarray(vector[:size], np.float32), head=np.asarray(vector[size:], np.float32))


def _template(model: ModelParams, with_head: bool) -> ModelParams:
    return ModelParams(encoder=model.encoder, head=model.head if with_head else None)


def released_mean(
    privacy: ResolvedPrivacy, clip: float, uploads: Sequence[Upload], current: ModelParams, with_head: bool, seed: int, round_index: int
) -> ModelParams:
    """The noised mean of the round's clipped updates, shaped like the shared part of
    `current` (the noise is released even when no client took part)."""
    template = _template(current, with_head)
    size = int(np.size(_flat(template)))
    vectors = [_flat(upload.models[UPDATE]) for upload in sorted(uploads, key=lambda u: u.client_id)]
    mean = private_mean(
        vectors,
        clip,
        privacy.update_noise_multiplier,
        privacy.expected_cohort,
        noise_stream(seed, round_index, SLOT_MEAN),
        size=size,
        noise_cohort_size=privacy.noise_cohort_size,
    )
    return _unflat(mean, template)


def released_encoder(privacy: ResolvedPrivacy, clip: float, uploads: Sequence[Upload], encoder: np.ndarray, seed: int, round_index: int) -> np.ndarray:
    """The shared encoder plus the noised mean of the round's clipped encoder updates (the
    point the server's step then moves to; the heads never left the clients)."""
    mean_update = released_mean(privacy, clip, uploads, ModelParams(encoder=encoder), with_head=False, seed=seed, round_index=round_index)
    return (np.asarray(encoder, np.float64) + mean_update.encoder).astype(np.float32)


def shifted(model: ModelParams, update: ModelParams) -> ModelParams:
    """model + update over the parts the update has (a head it lacks stays as it is)."""
    encoder = (np.asarray(model.encoder, np.float64) + update.encoder).astype(np.float32)
    if update.head is None:
        return ModelParams(encoder=encoder, head=model.head)
    return ModelParams(encoder=encoder, head=(np.asarray(model.head, np.float64) + update.head).astype(np.float32))


@dataclass(frozen=True)
class GroupRelease:
    """The noised mean update of each group (None where the noised count is below the
    minimum group size) and the noised counts."""

    means: list[ModelParams | None]
    counts: list[float]


def released_group_means(
    privacy: ResolvedPrivacy,
    clip: float,
    members: Sequence[tuple[int, Upload]],
    groups: int,
    current: ModelParams,
    with_head: bool,
    seed: int,
    round_index: int,
    slot: int = SLOT_GROUPS,
) -> GroupRelease:
    """One Gaussian release of every group's sum of clipped updates together with its
    count: each client adds [its update, C] to the one group it is in, a vector of norm at
    most C sqrt(2), so the G sums with N(0, (z C sqrt(2))^2) on every coordinate are one
    mechanism of multiplier z. A group's mean is its noised sum over its noised count."""
    sums: list[list[np.ndarray]] = [[] for _ in range(groups)]
    for group, upload in sorted(members, key=lambda member: member[1].client_id):
        if not 0 <= group < groups:
            raise ValueError(f"group {group} is outside the {groups} groups")
        sums[group].append(np.concatenate([_flat(upload.models[UPDATE]), np.asarray([clip], np.float32)]))
    return _group_release(privacy, clip, sums, _template(current, with_head), seed, round_index, slot)


def group_update_key(group: int) -> str:
    """Upload.models key of a client's clipped update against group `group`'s model (methods
    whose clients update every group's model by their share: FedSoft's centres)."""
    return f"{UPDATE}/{group}"


def released_per_group_means(
    privacy: ResolvedPrivacy,
    clip: float,
    members: Sequence[tuple[np.ndarray, Upload]],
    groups: int,
    current: ModelParams,
    with_head: bool,
    seed: int,
    round_index: int,
    slot: int = SLOT_GROUPS,
) -> GroupRelease:
    """`released_group_means` for soft memberships, where a client sends one clipped update
    per group, its model minus that group's model (`group_update_key`), and weights u over
    the groups (non-negative, summing to at most one; `bounded_shares` scales a larger sum
    down): client k adds u_s [its update against group s, C] to every group s. Each update has norm at most C, so the
    concatenation over the groups has norm at most sqrt(sum_s u_s^2) C sqrt(2) <= C sqrt(2):
    one mechanism of multiplier z. A group's mean is the u-weighted mean of its clients'
    (clipped) models minus the group's model, as FedSoft's centre is the u-weighted mean of
    the clients' models."""
    sums: list[list[np.ndarray]] = [[] for _ in range(groups)]
    for weights, upload in sorted(members, key=lambda member: member[1].client_id):
        shares = bounded_shares(weights, groups)
        for group in np.flatnonzero(shares > 0):
            update = _flat(upload.models[group_update_key(int(group))])
            sums[int(group)].append(shares[group] * np.concatenate([update, np.asarray([clip], np.float32)]).astype(np.float64))
    return _group_release(privacy, clip, sums, _template(current, with_head), seed, round_index, slot)


def bounded_shares(weights: np.ndarray, groups: int) -> np.ndarray:
    """A client's weights over `groups` groups as the release may count them: negative
    entries as 0, and scaled to sum to one when they sum to more (the bound the noise is
    calibrated to holds whatever a client sends)."""
    shares = np.asarray(weights, dtype=np.float64).ravel()
    if shares.shape != (groups,) or not np.isfinite(shares).all():
        raise ValueError(f"a client's group weights must be {groups} finite numbers, got {np.asarray(weights).tolist()}")
    shares = np.maximum(shares, 0.0)
    total = float(shares.sum())
    return shares / total if total > 1.0 else shares


def _group_release(
    privacy: ResolvedPrivacy, clip: float, sums: list[list[np.ndarray]], template: ModelParams, seed: int, round_index: int, slot: int
) -> GroupRelease:
    """Each group's vectors [update, C] (weighted) summed with N(0, (z C sqrt(2))^2) per
    coordinate from the release's stream, in group order; the mean where the noised count
    reaches the minimum group size."""
    size = int(np.size(_flat(template)))
    std = privacy.update_noise_multiplier * clip * math.sqrt(2.0) * privacy.noise_cohort_factor  # [update, C]: bound C sqrt(2)
    rng = noise_stream(seed, round_index, slot)
    means: list[ModelParams | None] = []
    counts: list[float] = []
    for vectors in sums:
        total = noised_sum(vectors, std, rng, size=size + 1).astype(np.float64)
        count = float(total[-1] / clip)
        counts.append(count)
        if count < max(1, privacy.min_group_size):
            means.append(None)
        else:
            means.append(_unflat((total[:-1] / count).astype(np.float32), template))
    return GroupRelease(means=means, counts=counts)


def next_round_clip(privacy: ResolvedPrivacy, state: ClipState, uploads: Sequence[Upload], seed: int, round_index: int) -> float:
    """Adaptive clipping's clip for the next round from the noised share of updates that
    were within the clip (Andrew et al.), or the clip unchanged without it."""
    adaptive = privacy.adaptive_clip
    if adaptive is None:
        return state.clip
    # each client's bit as a norm at or past the clip: the count is all the server learns
    norms = [0.0 if int(upload.values.get(WITHIN_CLIP, 0)) else math.inf for upload in uploads]
    fraction = noisy_unclipped_fraction(
        norms, state.clip, adaptive.count_noise_std, privacy.expected_cohort, noise_stream(seed, round_index, SLOT_COUNT)
    )
    rule = AdaptiveClip(
        clip=state.clip,
        target_quantile=adaptive.target_quantile,
        learning_rate=adaptive.learning_rate,
        count_noise_multiplier=adaptive.count_noise_std,
    )
    return float(next_clip(rule, fraction))


def stepped_by_soft_release(
    privacy: ResolvedPrivacy,
    clip: ClipState,
    members: Sequence[tuple[np.ndarray, Upload]],
    models: Sequence[ModelParams],
    server_optimizer: ServerOptimizerConfig,
    moments: ServerMoments,
    uploads: Sequence[Upload],
    seed: int,
    round_index: int,
) -> tuple[list[ModelParams], GroupRelease]:
    """One round of a soft-membership method's server under privacy (FedSoft's centres,
    FedCE's components): the full models move by `released_per_group_means` of the
    weighted clipped updates, through the server optimiser; a model whose noised count is
    below the minimum group size keeps its weights; the clip steps for the next round.
    Returns the new models and the release (its noised counts are what the events show)."""
    release = released_per_group_means(privacy, clip.clip, members, len(models), models[0], with_head=True, seed=seed, round_index=round_index)
    moved = [model if mean is None else shifted(model, mean) for model, mean in zip(models, release.means)]
    reached = {index for index, mean in enumerate(release.means) if mean is not None}
    stepped = server_step_clusters(server_optimizer, moments, list(models), moved, reached)
    clip.clip = next_round_clip(privacy, clip, uploads, seed, round_index)
    return stepped, release
