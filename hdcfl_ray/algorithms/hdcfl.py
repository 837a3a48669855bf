"""HDC-FL: FedAvg-SE's trajectory plus, at refresh rounds, head-derived groups,
encoder prototypes from the cache and a soft mixture per client (docs/hdcfl.md).

The personalised encoders are for inference only: training always starts from
the global encoder, so lambda = 0 and HDC-FL are scored from the same run. A
client without a cache entry at the last refresh falls back to the global
encoder."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, Mapping

import numpy as np
from pydantic import Field

from hdcfl_ray.algorithms.defaults import PrivateHead
from hdcfl_ray.algorithms.fedavg_se import FedAvgSE, SharedEncoderState
from hdcfl_ray.algorithms.newcomer_training import newcomer_head
from hdcfl_ray.algorithms.shared_encoder_scores import hdcfl_evaluation
from hdcfl_ray.contract import AutoKnob, ClientContext, ClientTask, EvalResult, MethodSpec, RunInfo, ModelParams, RoundNotes, Section, ServerOptimizerConfig, Upload, doubled_count
from hdcfl_ray.hdcfl.placement import GroupGeometry, place_head
from hdcfl_ray.hdcfl.refresh import refresh_summary, run_refresh


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


class HDCFL(FedAvgSE):
    name = "hdcfl"

    def __init__(
        self,
        params: HDCFLParams,
        rounds: int,
        seed: int,
        server_optimizer: ServerOptimizerConfig = ServerOptimizerConfig(),
        keep_geometry: bool = False,
    ) -> None:
        super().__init__(
            cache=params.cache, cache_precision=params.cache_precision, cache_dir=params.cache_dir, server_optimizer=server_optimizer
        )
        self.params = params
        self.keep_geometry = keep_geometry  # a run with newcomers places them with each refresh's geometry
        self.rounds = rounds
        self.seed = seed
        self.activation_round = params.activation_round or default_activation_round(rounds)

    def is_refresh_round(self, round_index: int) -> bool:
        if round_index < self.activation_round:
            return False
        return (round_index - self.activation_round) % self.params.refresh_every == 0 or round_index == self.rounds

    def refresh_index(self, round_index: int) -> int:
        """How many refreshes came before this round (derived, so a resumed run agrees)."""
        return sum(1 for earlier in range(1, round_index) if self.is_refresh_round(earlier))

    # ---- server ----
    def init_server(self, initial: ModelParams, independent: list[ModelParams], num_clients: int) -> HDCFLState:
        self._open_cache(num_clients, int(np.shape(initial.encoder)[0]))
        return HDCFLState(global_encoder=np.array(initial.encoder, dtype=np.float32, copy=True))

    def aggregate(self, state: HDCFLState, round_index: int, uploads: list[Upload]) -> RoundNotes:
        super().aggregate(state, round_index, uploads)
        return self._refresh_if_due(state, round_index)

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
        params, rounds=run.rounds, seed=run.seed, server_optimizer=run.server_optimizer, keep_geometry=bool(run.newcomers)
    ),
    applies_server_optimizer=True,
    asynchronous=True,
    check=_check,
    # G changes what the server makes of the heads at a refresh, never what a client trains
    auto_knobs=(AutoKnob("groups", (2, 3, 4, 6, 8), counts_models=True, beyond=doubled_count, server_side=True),),
    shortened=_shortened,
    newcomer_rule="a head trained on the frozen global encoder for protocol.newcomer_epochs epochs, its memberships "
    "against the last refresh's groups, and that mixture of prototypes with the head (the global encoder before a refresh)",
)
