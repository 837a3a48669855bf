"""FedAvg-SE: sample-weighted averaging of the encoder; every client keeps its own head.

The shared trajectory HDC-FL builds on. Clients train encoder and head jointly
from the global encoder; the server averages the encoders (BatchNorm statistics
included) and caches each client's latest encoder and head. A client is scored
with the global encoder and its own head (reference (a)); its own cached
encoder (reference (b)) is logged beside it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from hdcfl_ray.maths.aggregate import LazyColumn, weighted_average
from hdcfl_ray.maths.server_optimizer import ServerMoments, server_step
from hdcfl_ray.algorithms.defaults import AlgorithmDefaults, PrivateHead
from hdcfl_ray.algorithms.private_updates import ClipState, clipped_update, next_round_clip, private_upload, released_encoder
from hdcfl_ray.contract import (
    ClientContext,
    ClientTask,
    EvalResult,
    MethodSpec,
    ModelParams,
    PrivacyRule,
    ResolvedPrivacy,
    RoundNotes,
    ServerOptimizerConfig,
    Upload,
)
from hdcfl_ray.algorithms.shared_encoder_scores import shared_encoder_scores
from hdcfl_ray.algorithms.newcomer_training import newcomer_head
from hdcfl_ray.hdcfl.encoder_store import CachePrecision, CacheStorage, DiskEncoderStore, resolve_storage


@dataclass(frozen=True)
class CachedClient:
    """The server's latest copy of a client's upload. In memory storage the encoder
    is a zero-copy view of the object-store value that `encoder_ref` names; in disk
    storage it is the client's row of the memory-mapped cache and `encoder_ref` is None."""

    encoder: np.ndarray
    encoder_ref: Any
    head: np.ndarray
    num_samples: int
    round_index: int


@dataclass
class SharedEncoderState:
    global_encoder: np.ndarray
    cache: dict[int, CachedClient] = field(default_factory=dict)
    server_moments: ServerMoments = field(default_factory=dict)  # protocol.server_optimizer's state
    clip: ClipState | None = None  # under privacy: the clip the clients use this round (no cache is kept)


class FedAvgSE(AlgorithmDefaults):
    name = "fedavg_se"

    def __init__(
        self,
        cache: CacheStorage = "memory",
        cache_precision: CachePrecision = "float16",
        cache_dir: str | None = None,
        server_optimizer: ServerOptimizerConfig = ServerOptimizerConfig(),
        privacy: ResolvedPrivacy | None = None,
        seed: int = 0,
    ) -> None:
        self.server_optimizer = server_optimizer
        self.privacy = privacy
        self.seed = seed
        self.cache_storage = cache
        self.cache_precision = cache_precision
        self.cache_dir = cache_dir
        self._disk_store: DiskEncoderStore | None = None  # created on the server, never shipped

    def __getstate__(self) -> dict[str, Any]:
        # The algorithm travels to every actor; the server's memory map stays with the server.
        return {**self.__dict__, "_disk_store": None}

    # ---- server ----
    def init_server(self, initial: ModelParams, independent: list[ModelParams], num_clients: int) -> SharedEncoderState:
        self._open_cache(num_clients, int(np.shape(initial.encoder)[0]))
        return SharedEncoderState(global_encoder=np.array(initial.encoder, dtype=np.float32, copy=True), clip=self.initial_clip())

    def initial_clip(self) -> ClipState | None:
        return None if self.privacy is None else ClipState(self.privacy.clip)

    def _open_cache(self, num_clients: int, encoder_length: int) -> None:
        if self.privacy is not None:  # under privacy the server keeps no client's encoder
            return
        if resolve_storage(self.cache_storage, num_clients, encoder_length) == "disk":
            self._disk_store = DiskEncoderStore(num_clients, encoder_length, self.cache_precision, self.cache_dir)

    def export_cache(self, state: SharedEncoderState) -> dict[str, np.ndarray] | None:
        """The server cache (each client's last head and encoder) as plain arrays: what
        output.save_refresh_cache writes at each refresh, for ablate and donor-swap replays;
        None under privacy, where the server keeps no client's head or encoder."""
        if self.privacy is not None or not state.cache:
            return None
        client_ids = sorted(state.cache)
        return {
            "client_ids": np.asarray(client_ids, dtype=np.int64),
            "heads": np.stack([state.cache[k].head for k in client_ids]),
            "encoders": np.stack([state.cache[k].encoder for k in client_ids]),
            "num_samples": np.asarray([state.cache[k].num_samples for k in client_ids], dtype=np.int64),
            "global_encoder": np.asarray(state.global_encoder),
        }

    def broadcast(self, state: SharedEncoderState, round_index: int) -> dict[str, Any]:
        return {"global": state.global_encoder}

    def training_task(self, state: SharedEncoderState, round_index: int, client_id: int) -> ClientTask:
        return ClientTask(models=("global",), payload={} if self.privacy is None else {"clip": state.clip.clip})

    def aggregate(self, state: SharedEncoderState, round_index: int, uploads: list[Upload]) -> RoundNotes:
        if self.privacy is not None and state.clip is not None:
            self.aggregate_private_encoder(self.privacy, state, state.clip, round_index, uploads)
            return RoundNotes(releases=(self.privacy.release(),))
        if not uploads:
            return RoundNotes()
        ordered = sorted(uploads, key=lambda upload: upload.client_id)
        averaged = weighted_average(LazyColumn(ordered, lambda u: u.models["encoder"]), [u.num_samples for u in ordered])
        state.global_encoder = server_step(self.server_optimizer, state.server_moments, "global/encoder", state.global_encoder, averaged)
        for upload in ordered:
            self.async_record(state, round_index, upload)
        return RoundNotes()

    def aggregate_private_encoder(
        self, privacy: ResolvedPrivacy, state: SharedEncoderState, clip: ClipState, round_index: int, uploads: list[Upload]
    ) -> None:
        """Under privacy: the global encoder steps with the noised mean of the clipped encoder
        updates (released even when no client took part); the heads never left the clients."""
        averaged = released_encoder(privacy, clip.clip, uploads, state.global_encoder, self.seed, round_index)
        state.global_encoder = server_step(self.server_optimizer, state.server_moments, "global/encoder", state.global_encoder, averaged)
        clip.clip = next_round_clip(privacy, clip, uploads, self.seed, round_index)

    # ---- asynchronous mode: the runtime mixes single updates into the shared vector ----
    def async_shared(self, state: SharedEncoderState) -> np.ndarray:
        return state.global_encoder

    def async_set_shared(self, state: SharedEncoderState, vector: np.ndarray) -> None:
        state.global_encoder = np.asarray(vector, dtype=np.float32)

    def async_upload_vector(self, upload: Upload) -> np.ndarray:
        return upload.models["encoder"]

    def async_record(self, state: SharedEncoderState, version: int, upload: Upload) -> None:
        if self._disk_store is not None:
            # The row copy lets Ray free the upload: the cache no longer pins K encoders in memory.
            encoder, encoder_ref = self._disk_store.put(upload.client_id, upload.models["encoder"]), None
        else:
            encoder, encoder_ref = upload.models["encoder"], upload.models_ref
        state.cache[upload.client_id] = CachedClient(
            encoder=encoder,
            encoder_ref=encoder_ref,
            head=upload.values["head"],
            num_samples=upload.num_samples,
            round_index=version,
        )

    def async_after_apply(self, state: SharedEncoderState, version: int) -> RoundNotes:
        return RoundNotes()

    def evaluation_task(self, state: SharedEncoderState, round_index: int, client_id: int, final: bool) -> ClientTask:
        cached = state.cache.get(client_id)
        return ClientTask(models=("global",), payload={"own_upload": None if cached is None else cached.encoder_ref})

    # ---- client ----
    def local_update(self, ctx: ClientContext, state: PrivateHead, task: ClientTask, objects: Mapping[str, Any]) -> tuple[Upload, PrivateHead]:
        ctx.load(ModelParams(objects["global"]), head=state.head)
        stats = ctx.train()
        trained = ctx.snapshot()
        if "clip" in task.payload:  # privacy: the clipped encoder update; the head stays here
            clip = float(task.payload["clip"])
            update, norm = clipped_update(ModelParams(objects["global"]), trained, clip, with_head=False)
            upload = private_upload(ctx.client_id, stats.num_samples, stats.mean_loss, stats.steps, update, norm, clip, **self.private_values(task, trained))
            return upload, PrivateHead(head=trained.head)
        upload = Upload(
            client_id=ctx.client_id,
            num_samples=stats.num_samples,
            train_loss=stats.mean_loss,
            steps=stats.steps,
            models={"encoder": trained.encoder},
            values={"head": trained.head},
        )
        return upload, PrivateHead(head=trained.head)

    def private_values(self, task: ClientTask, trained: ModelParams) -> dict[str, Any]:
        """What a client adds to its clipped update under privacy (HDC-FL: its head sketch at a refresh)."""
        return {}

    def evaluate(self, ctx: ClientContext, state: PrivateHead, task: ClientTask, objects: Mapping[str, Any], final: bool) -> EvalResult:
        return EvalResult(references=self.shared_encoder_references(ctx, state, task, objects), headline="global")

    # ---- newcomers (partition.newcomers): a head trained on the frozen global encoder ----
    def newcomer_task(self, state: SharedEncoderState, round_index: int, client_id: int, probe: Mapping[str, Any] | None) -> ClientTask:
        return ClientTask(models=("global",))

    def evaluate_newcomer(self, ctx: ClientContext, state: PrivateHead, task: ClientTask, objects: Mapping[str, Any], epochs: int) -> EvalResult:
        head = newcomer_head(ctx, objects["global"], state.head, epochs)
        return EvalResult(references=shared_encoder_scores(ctx, head, objects["global"], None), headline="global")

    @staticmethod
    def shared_encoder_references(ctx: ClientContext, state: PrivateHead, task: ClientTask, objects: Mapping[str, Any]) -> dict[str, Any]:
        own_upload = task.payload.get("own_upload")
        wanted = own_upload is not None and ctx.protocol.eval_local_reference
        return shared_encoder_scores(ctx, state.head, objects["global"], own_upload["encoder"] if wanted else None)


# the newcomer rule of the methods that score a client with the global encoder and its own head
SHARED_ENCODER_RULE = "the global encoder and a head trained on it, encoder frozen, for protocol.newcomer_epochs epochs"


METHOD = MethodSpec(
    name="fedavg_se",
    summary="FedAvg-SE: a shared encoder is averaged, every client keeps a private head",
    build=lambda _params, run: FedAvgSE(server_optimizer=run.server_optimizer, privacy=run.privacy, seed=run.seed),
    applies_server_optimizer=True,
    asynchronous=True,
    newcomer_rule=SHARED_ENCODER_RULE,
    privacy=PrivacyRule(
        sends="the shared encoder's update, clipped: one noised mean a round",
        kept_on_client="the head, and the encoder it trained (the server keeps no cache, so no 'local' reference)",
    ),
)
