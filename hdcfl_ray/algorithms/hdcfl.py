"""HDC-FL: FedAvg-SE's trajectory plus, at refresh rounds, head-derived groups,
encoder prototypes from the cache and a soft mixture per client (docs/hdcfl.md).

The personalised encoders are for inference only: training always starts from
the global encoder, so lambda = 0 and HDC-FL are scored from the same run. A
client without a cache entry at the last refresh falls back to the global
encoder."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Mapping

import numpy as np
from pydantic import Field

from hdcfl_ray import seeding
from hdcfl_ray.algorithms.defaults import PrivateHead
from hdcfl_ray.algorithms.fedavg_se import FedAvgSE, SharedEncoderState
from hdcfl_ray.algorithms.newcomer_training import newcomer_head
from hdcfl_ray.algorithms.private_updates import SLOT_DESCRIPTORS, SLOT_GROUPS, noise_stream, released_group_means
from hdcfl_ray.algorithms.shared_encoder_scores import hdcfl_evaluation
from hdcfl_ray.contract import (
    AutoKnob,
    ClientContext,
    ClientTask,
    EvalResult,
    MethodSpec,
    ModelParams,
    PrivacyRule,
    RefreshSummary,
    ResolvedPrivacy,
    RoundNotes,
    RunInfo,
    Section,
    ServerOptimizerConfig,
    Upload,
    doubled_count,
)
from hdcfl_ray.hdcfl.placement import GroupGeometry, place_head
from hdcfl_ray.hdcfl.private_grouping import (
    SKETCH_RELEASES_PER_REFRESH,
    SketchPlan,
    bin_noise_std,
    head_sketch,
    initial_centres,
    memberships_from_centres,
    released_grouping,
    sketch_axes,
    sketch_plan,
)
from hdcfl_ray.hdcfl.refresh import kmeans_seed, refresh_summary, run_refresh


class HDCFLParams(Section):
    """HDC-FL's server-side settings (docs/hdcfl.md)."""

    descriptor: Literal["lowrank", "raw"] = Field("lowrank", description="head descriptor: normalised rank-r (lowrank) or the flattened heads (raw)")
    rank: int = Field(8, ge=1, description="r; effective rank = min(r, K-1, rank of the heads)")
    groups: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        "auto",
        description="G, the k-means groups; auto = chosen before the run on held-out training images among 2, 3, 4, 6, 8 "
        "(replays of one shortened run: G changes no training; docs/hdcfl.md)",
    )
    membership: Literal["soft", "hard"] = Field("soft", description="softmax over distances to the group centres (soft) or the own group only (hard)")
    temperature: float = Field(1.0, gt=0.0, description="tau of the soft memberships: T = tau x temperature_scale's spread")
    temperature_scale: Literal["within", "between"] = Field(
        "within",
        description="the spread T is measured in: within = mean squared distance to the own group centre (spec; "
        "near-hard when groups are tight), between = mean squared distance between group centres",
    )
    mix: float = Field(1.0, ge=0.0, le=1.0, description="lambda: 0 = global encoder, 1 = prototype mixture")
    prototypes: Literal["hard", "soft"] = Field("hard", description="a prototype is its members' sample-weighted mean (hard) or weighs every client by pi * n (soft)")
    activation_round: int | None = Field(None, ge=1, description="first refresh round; null = 20% of the rounds (at least round 1)")
    refresh_every: int = Field(10, ge=1, description="R, rounds between refreshes (the last round always refreshes)")
    kmeans_init: int = Field(10, ge=1, description="k-means restarts")
    sketch_width: int = Field(
        64,
        ge=1,
        description="under a privacy section: the head sketch's largest width, the public directions each head is projected "
        "on before the private grouping; the run uses fewer where the noise would swamp them (docs/privacy.md); capped at "
        "the head's length",
    )
    # hdcfl/encoder_store.py: memory, or a memory-mapped file for large K x encoder size
    cache: Literal["auto", "memory", "disk"] = Field("auto", description="where the server keeps the K cached encoders; auto = disk above 4 GiB")
    cache_precision: Literal["float32", "float16"] = Field("float16", description="disk cache only: storage precision")
    cache_dir: str | None = Field(None, description="disk cache only: folder for the (unlinked) file; null = system temp")


def default_activation_round(rounds: int) -> int:
    """t_a defaults to 20% of the rounds, at least round 1."""
    return max(1, int(round(0.2 * rounds)))


@dataclass(frozen=True)
class Personalisation:
    """phi_k = (1 - mix) * global + mix * sum_g memberships[k, g] * prototypes[g]."""

    prototypes: np.ndarray  # (G, D)
    memberships: dict[int, np.ndarray]  # client id -> (G,)
    group_labels: dict[int, int]
    refresh_round: int
    # what places a newcomer's head among the groups (kept only in a run with partition.newcomers)
    geometry: GroupGeometry | None = None


@dataclass
class HDCFLState(SharedEncoderState):
    personalisation: Personalisation | None = None
    # under privacy: each client's last head sketch, by client id (the server's own record: what
    # it releases of them is the noised centres), and the released group centres
    sketches: dict[int, np.ndarray] = field(default_factory=dict)
    centres: np.ndarray | None = None


SKETCH = "head_sketch"  # Upload.values key of a client's head sketch under privacy (refresh rounds)


def refreshes_at(round_index: int, activation_round: int, refresh_every: int, rounds: int) -> bool:
    """Whether a run of `rounds` rounds refreshes at `round_index`: from the activation round
    every `refresh_every` rounds, and at the last round."""
    if round_index < activation_round:
        return False
    return (round_index - activation_round) % refresh_every == 0 or round_index == rounds


def refresh_rounds(params: HDCFLParams, rounds: int) -> list[int]:
    """The refresh rounds of a run of `rounds` rounds (HDCFL.is_refresh_round's schedule)."""
    activation = params.activation_round or default_activation_round(rounds)
    return [r for r in range(1, rounds + 1) if refreshes_at(r, activation, params.refresh_every, rounds)]


class HDCFL(FedAvgSE):
    name = "hdcfl"

    def __init__(
        self,
        params: HDCFLParams,
        rounds: int,
        seed: int,
        server_optimizer: ServerOptimizerConfig = ServerOptimizerConfig(),
        keep_geometry: bool = False,
        privacy: ResolvedPrivacy | None = None,
    ) -> None:
        super().__init__(
            cache=params.cache,
            cache_precision=params.cache_precision,
            cache_dir=params.cache_dir,
            server_optimizer=server_optimizer,
            privacy=privacy,
            seed=seed,
        )
        self.params = params
        self.keep_geometry = keep_geometry  # a run with newcomers places them with each refresh's geometry
        self.rounds = rounds
        self.seed = seed
        self.activation_round = params.activation_round or default_activation_round(rounds)

    def is_refresh_round(self, round_index: int) -> bool:
        return refreshes_at(round_index, self.activation_round, self.params.refresh_every, self.rounds)

    def refresh_index(self, round_index: int) -> int:
        """How many refreshes came before this round (derived, so a resumed run agrees)."""
        return sum(1 for earlier in range(1, round_index) if self.is_refresh_round(earlier))

    # ---- server ----
    def init_server(self, initial: ModelParams, independent: list[ModelParams], num_clients: int) -> HDCFLState:
        self._open_cache(num_clients, int(np.shape(initial.encoder)[0]))
        return HDCFLState(global_encoder=np.array(initial.encoder, dtype=np.float32, copy=True), clip=self.initial_clip())

    def aggregate(self, state: HDCFLState, round_index: int, uploads: list[Upload]) -> RoundNotes:
        if self.privacy is not None and state.clip is not None:
            return self._aggregate_private(self.privacy, state, round_index, uploads)
        super().aggregate(state, round_index, uploads)
        return self._refresh_if_due(state, round_index)

    # ---- under privacy (docs/privacy.md): noised sketches and noised group sums ----
    def training_task(self, state: HDCFLState, round_index: int, client_id: int) -> ClientTask:
        task = super().training_task(state, round_index, client_id)
        if self.privacy is None or not self.is_refresh_round(round_index):
            return task
        width = self._sketch_plan(self.privacy).width
        return ClientTask(models=task.models, payload={**task.payload, "sketch_width": width})

    def _sketch_plan(self, privacy: ResolvedPrivacy, head_length: int | None = None) -> SketchPlan:
        """The width the clients sketch at and whether the refresh seeds (public values only:
        z, the noise cohort's factor, the expected clients a round and G)."""
        sigma = bin_noise_std(privacy.update_noise_multiplier, privacy.noise_cohort_factor)
        return sketch_plan(self.params.sketch_width, int(self.params.groups), sigma, privacy.expected_cohort, head_length)

    def private_values(self, task: ClientTask, trained: ModelParams) -> dict[str, Any]:
        if "sketch_width" not in task.payload or trained.head is None or not np.isfinite(trained.head).all():
            return {}  # a head whose training diverged sends no sketch: the client keeps its last place
        axes = sketch_axes(self.seed, int(np.size(trained.head)), int(task.payload["sketch_width"]))
        return {SKETCH: head_sketch(trained.head, axes)}

    def _aggregate_private(self, privacy: ResolvedPrivacy, state: HDCFLState, round_index: int, uploads: list[Upload]) -> RoundNotes:
        """Every round the global encoder's noised mean; at a refresh round also the mean head
        sketch (one release) and the groups' centres, refined by private Lloyd steps on the
        sampled clients' centred sketches (each step one release), and each group's noised sum of this round's encoder updates with
        its noised count (one release), from which the prototypes come."""
        assert state.clip is not None
        start = np.array(state.global_encoder, dtype=np.float32, copy=True)
        clip = state.clip.clip
        self.aggregate_private_encoder(privacy, state, state.clip, round_index, uploads)
        releases = [privacy.release()]
        if not self.is_refresh_round(round_index):
            return RoundNotes(releases=tuple(releases))
        sampled = sorted(uploads, key=lambda u: u.client_id)
        for upload in sampled:
            if SKETCH in upload.values:
                state.sketches[upload.client_id] = np.asarray(upload.values[SKETCH], dtype=np.float64)
        sampled = [upload for upload in sampled if SKETCH in upload.values]
        if not state.sketches:  # no client has sent a sketch yet: nothing to group, nothing released
            return RoundNotes(releases=tuple(releases), events=(f"HDC-FL round {round_index}: no head sketch yet, no groups",))
        width = int(next(iter(state.sketches.values())).shape[0])
        centres = state.centres if state.centres is not None else initial_centres(self.seed, int(self.params.groups), width)
        raw = np.stack([state.sketches[u.client_id] for u in sampled]) if sampled else np.zeros((0, width))
        release_of_sketches = released_grouping(
            raw,
            centres,
            privacy.update_noise_multiplier,
            privacy.noise_cohort_factor,
            privacy.min_group_size,
            seeding.int_seed(self.seed, "privacy_seeding", round_index),
            [noise_stream(self.seed, round_index, SLOT_DESCRIPTORS + 10 * release) for release in range(SKETCH_RELEASES_PER_REFRESH)],
            seeding=self._sketch_plan(privacy, head_length=width).seeding,
        )
        state.centres = release_of_sketches.centres
        releases += [privacy.release()] * SKETCH_RELEASES_PER_REFRESH
        grouping = memberships_from_centres(
            state.sketches, release_of_sketches.mean, release_of_sketches.centres, self.params.membership, self.params.temperature
        )
        client_ids = sorted(state.sketches)
        label_of = {k: int(grouping.labels[i]) for i, k in enumerate(client_ids)}
        members = [(label_of[u.client_id], u) for u in sampled]
        release = released_group_means(
            privacy, clip, members, grouping.num_groups, ModelParams(encoder=start), with_head=False, seed=self.seed, round_index=round_index, slot=SLOT_GROUPS
        )
        releases.append(privacy.release())
        prototypes = np.stack(
            [state.global_encoder if mean is None else (start.astype(np.float64) + mean.encoder).astype(np.float32) for mean in release.means]
        )
        summary = RefreshSummary(
            round_index=round_index,
            group_labels=label_of,
            memberships={k: grouping.memberships[i] for i, k in enumerate(client_ids)},
            silhouette=float(grouping.silhouette),
            effective_rank=width,
            num_groups=grouping.num_groups,
            descriptor_kind="centred head sketches, private seeding and Lloyd steps",
        )
        state.personalisation = Personalisation(
            prototypes=prototypes,
            memberships=dict(summary.memberships),
            group_labels=dict(summary.group_labels),
            refresh_round=round_index,
        )
        kept = [g for g, mean in enumerate(release.means) if mean is None]
        events = (
            (f"HDC-FL round {round_index}: groups {kept} released no prototype (noised count below privacy.min_group_size); the global encoder stands in",)
            if kept
            else ()
        )
        return RoundNotes(refresh=summary, releases=tuple(releases), events=events)

    def async_after_apply(self, state: HDCFLState, version: int) -> RoundNotes:
        """In asynchronous mode rounds are server versions: refresh every R versions."""
        return self._refresh_if_due(state, version)

    def _refresh_if_due(self, state: HDCFLState, round_index: int) -> RoundNotes:
        if not self.is_refresh_round(round_index) or not state.cache:
            return RoundNotes()
        client_ids = sorted(state.cache)
        heads = np.stack([state.cache[k].head for k in client_ids])
        # A list, not a stack: rows are read one at a time, so a disk cache is never loaded whole.
        encoders = [state.cache[k].encoder for k in client_ids]
        counts = np.asarray([state.cache[k].num_samples for k in client_ids], dtype=np.float64)
        # k-means is seeded by the run seed and the refresh index, so a run is reproducible.
        result = run_refresh(heads, encoders, counts, self.params, seed=self.seed, refresh_index=self.refresh_index(round_index))
        summary = refresh_summary(round_index, client_ids, result, self.params.descriptor)
        state.personalisation = Personalisation(
            prototypes=result.prototypes,
            memberships=dict(summary.memberships),
            group_labels=dict(summary.group_labels),
            refresh_round=round_index,
            geometry=result.geometry if self.keep_geometry else None,
        )
        return RoundNotes(refresh=summary)

    def broadcast(self, state: HDCFLState, round_index: int) -> dict[str, Any]:
        objects = super().broadcast(state, round_index)
        if state.personalisation is not None:
            objects["prototypes"] = state.personalisation.prototypes
        return objects

    def evaluation_task(self, state: HDCFLState, round_index: int, client_id: int, final: bool) -> ClientTask:
        task = super().evaluation_task(state, round_index, client_id, final)
        personalisation = state.personalisation
        if personalisation is None or client_id not in personalisation.memberships:
            return task
        payload = {
            **task.payload,
            "membership": personalisation.memberships[client_id],
            "group": personalisation.group_labels[client_id],
        }
        return ClientTask(models=("global", "prototypes"), payload=payload)

    # ---- client ----
    def evaluate(self, ctx: ClientContext, state: PrivateHead, task: ClientTask, objects: Mapping[str, Any], final: bool) -> EvalResult:
        own_upload = task.payload.get("own_upload")
        return hdcfl_evaluation(
            ctx,
            state.head,
            objects["global"],
            own_encoder=own_upload["encoder"] if own_upload is not None and ctx.protocol.eval_local_reference else None,
            prototypes=objects.get("prototypes"),
            membership=task.payload.get("membership"),
            group=task.payload.get("group"),
            mix=self.params.mix,
        )

    # ---- newcomers (partition.newcomers): its head, placed among the last refresh's groups ----
    def newcomer_task(self, state: HDCFLState, round_index: int, client_id: int, probe: Mapping[str, Any] | None) -> ClientTask:
        personalisation = state.personalisation
        if personalisation is None or personalisation.geometry is None:  # before the first refresh: the global encoder
            return ClientTask(models=("global",))
        return ClientTask(models=("global", "prototypes"), payload={"geometry": personalisation.geometry})

    def evaluate_newcomer(self, ctx: ClientContext, state: PrivateHead, task: ClientTask, objects: Mapping[str, Any], epochs: int) -> EvalResult:
        """A head trained on the frozen global encoder (as FedAvg-SE's newcomer), its descriptor and
        memberships against the last refresh's groups (`place_head`, as the refresh placed the
        cached heads), and the mixture of prototypes those memberships give, scored with that head
        (as a grouped client is)."""
        head = newcomer_head(ctx, objects["global"], state.head, epochs)
        geometry = task.payload.get("geometry")
        placement = None if geometry is None else place_head(geometry, head)
        return hdcfl_evaluation(
            ctx,
            head,
            objects["global"],
            own_encoder=None,
            prototypes=objects.get("prototypes"),
            membership=None if placement is None else placement.memberships,
            group=None if placement is None else placement.group,
            mix=self.params.mix,
        )


def _check(params: HDCFLParams, run: RunInfo) -> str | None:
    activation = params.activation_round
    if activation is not None and activation > run.rounds:
        return (
            f"activation_round: {activation} is after the last round "
            f"(protocol.rounds = {run.rounds}); choose 1..{run.rounds}"
        )
    return None


def _shortened(params: HDCFLParams, rounds: int) -> HDCFLParams:
    """A candidate run of `rounds` rounds refreshes inside them: a first refresh round set
    for the full run moves to the same share of the shortened one (the last round always
    refreshes, so the candidate is scored with its groups)."""
    if params.activation_round is None or params.activation_round <= rounds:
        return params
    return params.model_copy(update={"activation_round": max(1, rounds - 1)})


METHOD = MethodSpec(
    name="hdcfl",
    summary="HDC-FL: groups read off the private heads, each client scored with a soft mixture of encoder prototypes",
    params=HDCFLParams,
    build=lambda params, run: HDCFL(
        params,
        rounds=run.rounds,
        seed=run.seed,
        server_optimizer=run.server_optimizer,
        keep_geometry=bool(run.newcomers) and run.privacy is None,
        privacy=run.privacy,
    ),
    applies_server_optimizer=True,
    asynchronous=True,
    check=_check,
    # G changes what the server makes of the heads at a refresh, never what a client trains
    auto_knobs=(AutoKnob("groups", (2, 3, 4, 6, 8), counts_models=True, beyond=doubled_count, server_side=True),),
    shortened=_shortened,
    newcomer_rule="a head trained on the frozen global encoder for protocol.newcomer_epochs epochs, its memberships "
    "against the last refresh's groups, and that mixture of prototypes with the head (the global encoder before a refresh)",
    privacy=PrivacyRule(
        sends="the shared encoder's update, clipped (one noised mean a round); at a refresh round also its head sketch (its "
        "unit head on public directions, norm at most 1) into the noised mean sketch (one release) and, centred by that mean, "
        "into the noised sums and counts of the seeding bins (a third Lloyd step where the noise is too large to seed) and of "
        "two private Lloyd steps (a release each), and its encoder update into its group's noised sum with a noised count (one release), the prototypes",
        kept_on_client="the head (the groups' centres come from noised sums of sketches, never from a head) and the encoder "
        "it trained (no cache)",
        planned_releases=lambda params, rounds, total: (
            (1.0, rounds + (SKETCH_RELEASES_PER_REFRESH + 1) * sum(1 for r in refresh_rounds(params, total) if r <= rounds)),
        ),
    ),
)
