"""How every server round ends, synchronous or asynchronous, and what it reports.

Both servers take a finished update into the method's hands with
`accepted_upload` (an update holding NaN/Inf is logged and left out), and end a
round with `close_round`: every client is evaluated when the round is due (every
`protocol.eval_every` rounds, the last round, and any round that refreshed), and so
is every newcomer by the method's newcomer rule (newcomers.py), the
host pool's events and the round's traffic (traffic.py) are collected, and the
`RoundReport` the driver logs is built.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from hdcfl_ray.contract import RoundNotes, Upload
from hdcfl_ray.runtime.server.host_pool import HostPool, TrainingHandle
from hdcfl_ray.runtime.server.messages import EvalReport, NewcomerReport, UploadMeta
from hdcfl_ray.runtime.server.settings import ServerSettings
from hdcfl_ray.runtime.server.stored_models import StoredModels
from hdcfl_ray.runtime.server.traffic import RoundTraffic, TrafficMeter
from hdcfl_ray.runtime.server.transport import Transport


@dataclass(frozen=True)
class UpdateTiming:
    client_id: int
    status: str  # applied | rejected_nonfinite | dropped_late (sync); applied | buffered | rejected_nonfinite (async)
    virtual_start: float
    virtual_finish: float
    staleness: int


@dataclass(frozen=True)
class RoundReport:
    round_index: int
    selected: list[int]
    uploads: list[UploadMeta]  # accepted and rejected; client-id order (sync) or virtual-finish order (async)
    eval_reports: list[EvalReport]
    notes: RoundNotes
    server_seconds: float
    events: list[str] = field(default_factory=list)
    timings: list[UpdateTiming] = field(default_factory=list)
    virtual_time: float = 0.0  # virtual clock at the end of the round
    aggregate_seconds: float = 0.0  # server-side aggregation, a method's regrouping (refresh) included
    traffic: RoundTraffic = field(default_factory=RoundTraffic)  # each client's bytes this round, evaluation included
    # the newcomers (partition.newcomers) scored by the method's newcomer rule, at evaluated rounds
    newcomers: list[NewcomerReport] = field(default_factory=list)
    # under privacy: the epsilon spent once this round's releases are counted (None without privacy)
    epsilon: float | None = None
    # why the run ends after this round though rounds remain (privacy.max_epsilon), or None
    stop_reason: str | None = None


class RoundServer(Protocol):
    """What ending a round needs of a server (`FederatedServer` and `AsyncFederatedServer`)."""

    rounds: int
    settings: ServerSettings
    pool: HostPool
    virtual_time: float
    traffic: TrafficMeter

    def evaluate_clients(self, round_index: int, final: bool) -> list[EvalReport]: ...

    def evaluate_newcomers(self, round_index: int) -> list[NewcomerReport]: ...


def accepted_upload(
    meta: UploadMeta, handle: TrainingHandle, transport: Transport, events: list[str], not_taken: str
) -> Upload | None:
    """The method's view of one finished update, its models read on access
    (`StoredModels`: the round's uploads are never all held at once); None when the
    update held NaN/Inf, with an event ending in `not_taken` (what the server skips)."""
    client_id = handle.client_id
    if not meta.accepted:
        events.append(f"client {client_id}: update rejected (NaN/Inf); {not_taken}")
        return None
    return Upload(
        client_id=client_id,
        num_samples=meta.num_samples,
        train_loss=meta.train_loss,
        steps=meta.steps,
        models=StoredModels(transport, handle.models_ref),
        values=meta.values,
        models_ref=handle.models_ref,
    )


def evaluation_due(round_index: int, rounds: int, eval_every: int, refresh: Any) -> bool:
    """Every `eval_every` rounds, the last round, and a round that refreshed."""
    return round_index % eval_every == 0 or round_index == rounds or refresh is not None


def close_round(
    server: RoundServer,
    round_index: int,
    started: float,
    *,
    selected: list[int],
    uploads: list[UploadMeta],
    notes: RoundNotes,
    events: list[str],
    timings: list[UpdateTiming],
    aggregate_seconds: float,
    late_events: Sequence[str] = (),
    epsilon: float | None = None,
    stop_reason: str | None = None,
) -> RoundReport:
    """Evaluate if due, then report the round. `started` is the round's perf_counter
    start. The report's events are `events`, then the host pool's, then `late_events`
    (the asynchronous server logs its method's notes there, after the pool's). A round
    with a `stop_reason` is the run's last: it is evaluated as the last round is."""
    final = round_index == server.rounds or stop_reason is not None
    due = final or evaluation_due(round_index, server.rounds, server.settings.protocol.eval_every, notes.refresh)
    eval_reports = server.evaluate_clients(round_index, final) if due else []
    newcomers = server.evaluate_newcomers(round_index) if due else []
    events = [*events, *server.pool.take_events(), *late_events]
    traffic = server.traffic.take()  # after the evaluation, whose downloads belong to this round
    return RoundReport(
        round_index=round_index,
        selected=selected,
        uploads=uploads,
        eval_reports=eval_reports,
        notes=notes,
        server_seconds=time.perf_counter() - started,
        events=events,
        timings=timings,
        virtual_time=server.virtual_time,
        aggregate_seconds=aggregate_seconds,
        traffic=traffic,
        newcomers=newcomers,
        epsilon=epsilon,
        stop_reason=stop_reason,
    )
