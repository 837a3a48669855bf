"""The server: runs one synchronous round at a time through the algorithm's hooks.

It puts each broadcast object (the global encoder, prototypes, cluster models)
in the object store once per round and sends ObjectRefs; collects the clients'
updates as they finish and hands them to the algorithm in client-id order, so a
run is reproducible whatever the arrival order; rejects updates holding NaN/Inf.
`FederatedServer` is a plain object; `ServerActor` (runtime/backends/actors.py) is the
Ray actor around it. It imports no torch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from hdcfl_ray.config.schema import ProtocolConfig
from hdcfl_ray.contract import ClientTask, Method, ModelParams, RoundNotes, Upload
from hdcfl_ray.runtime.server.host_pool import HostPool
from hdcfl_ray.runtime.server.messages import ClientJob, EvalReport, UploadMeta
from hdcfl_ray.runtime.server.sampling import available_clients, plan_round, select_clients, selection_size
from hdcfl_ray.runtime.server.transport import RayTransport, Transport
from hdcfl_ray.runtime.server.virtual_clock import ClientProfile


@dataclass(frozen=True)
class ServerSettings:
    num_clients: int
    clients_per_round: int
    seed: int
    protocol: ProtocolConfig
    client_train_sizes: tuple[int, ...]
    profiles: tuple[ClientProfile, ...]

    @property
    def rounds(self) -> int:
        return self.protocol.rounds


def build_server_settings(scenario: Any, partition: Any) -> ServerSettings:
    """From a Scenario and a Partition (typed loosely: the server imports no data code)."""
    from hdcfl_ray.runtime.server.virtual_clock import client_profiles

    return ServerSettings(
        num_clients=partition.num_clients,
        clients_per_round=scenario.clients_per_round(),
        seed=scenario.seed,
        protocol=scenario.protocol,
        client_train_sizes=tuple(client.num_train for client in partition.clients),
        profiles=tuple(client_profiles(scenario.protocol.system, partition.num_clients, scenario.seed)),
    )


@dataclass(frozen=True)
class UpdateTiming:
    client_id: int
    status: str  # applied | rejected_nonfinite | dropped_late
    virtual_start: float
    virtual_finish: float
    staleness: int


@dataclass(frozen=True)
class RoundReport:
    round_index: int
    selected: list[int]
    uploads: list[UploadMeta]  # client-id order, accepted and rejected
    eval_reports: list[EvalReport]
    notes: RoundNotes
    server_seconds: float
    events: list[str] = field(default_factory=list)
    timings: list[UpdateTiming] = field(default_factory=list)
    virtual_time: float = 0.0  # virtual clock at the end of the round
    aggregate_seconds: float = 0.0  # server-side aggregation, an HDC-FL refresh included


class FederatedServer:
    def __init__(
        self,
        algorithm: Method,
        hosts: list,
        client_hosts: dict[int, int],
        initial: ModelParams,
        independent: list[ModelParams],
        settings: ServerSettings,
        transport: Transport | None = None,
        host_spawner: Any = None,
        max_replacements: int = 0,
    ) -> None:
        self.transport: Transport = transport or RayTransport()
        self.algorithm = algorithm
        self.client_hosts = client_hosts
        self.settings = settings
        self.num_clients = settings.num_clients
        self.rounds = settings.rounds
        self.seed = settings.seed
        self.state = algorithm.init_server(initial, independent, settings.num_clients)
        self._encoder_size = int(initial.encoder.shape[0])
        self.virtual_time = 0.0
        self.pool = HostPool(hosts, client_hosts, self.transport, spawner=host_spawner, max_replacements=max_replacements)

    def encoder_size(self) -> int:
        """Floats in the encoder vector (for the manifest)."""
        return self._encoder_size

    def host_handles(self) -> list:
        """The hosts now serving (replacements included), e.g. to shut them down."""
        return list(self.pool.hosts)

    def refresh_cache(self) -> dict[str, Any] | None:
        """The cache an HDC-FL refresh used (after this round's aggregation), as plain arrays."""
        cache = getattr(self.state, "cache", None)
        if cache is None:
            return None
        import numpy as np

        client_ids = sorted(cache)
        return {
            "client_ids": np.asarray(client_ids, dtype=np.int64),
            "heads": np.stack([cache[k].head for k in client_ids]),
            "encoders": np.stack([cache[k].encoder for k in client_ids]),
            "num_samples": np.asarray([cache[k].num_samples for k in client_ids], dtype=np.int64),
            "global_encoder": np.asarray(self.state.global_encoder),
        }

    # ---- checkpoints ----
    def snapshot(self) -> dict[str, Any]:
        """Everything needed to continue after the last finished round."""
        return {"state": self.state, "virtual_time": self.virtual_time, "client_states": dict(self.pool.state_refs)}

    def restore(self, snapshot: dict[str, Any]) -> None:
        self.state = snapshot["state"]
        self.virtual_time = snapshot["virtual_time"]
        self.pool.state_refs = dict(snapshot["client_states"])

    def _put_broadcast(self, round_index: int) -> dict[str, Any]:
        return {name: self.transport.put(value) for name, value in self.algorithm.broadcast(self.state, round_index).items()}

    def _jobs_per_host(self, tasks: dict[int, ClientTask]) -> dict[int, list[ClientJob]]:
        jobs: dict[int, list[ClientJob]] = {}
        for client_id in sorted(tasks):
            job = ClientJob(client_id, tasks[client_id], self.pool.state_of(client_id))
            jobs.setdefault(self.client_hosts[client_id], []).append(job)
        return jobs

    def run_round(self, round_index: int) -> RoundReport:
        started = time.perf_counter()
        events: list[str] = []
        settings = self.settings
        protocol = settings.protocol
        round_start = self.virtual_time
        online = [
            k
            for k in available_clients(self.num_clients, protocol.availability, self.seed, round_index)
            if settings.profiles[k].is_available(round_start)
        ]
        wanted = min(settings.clients_per_round, len(online))
        sampled = select_clients(
            self.num_clients, selection_size(settings.clients_per_round, protocol.stragglers, len(online)), self.seed, round_index, online
        )
        if not online:
            events.append("no client is available this round; the global state is unchanged")

        probe_tasks = {k: t for k in range(self.num_clients) if (t := self.algorithm.probe_task(self.state, round_index, k)) is not None}
        if probe_tasks:
            object_refs = self._put_broadcast(round_index)
            answers = self.pool.call_per_host(
                "probe",
                {host: (lambda jobs=jobs: (jobs, round_index, object_refs)) for host, jobs in self._jobs_per_host(probe_tasks).items()},
            )
            results = {k: v for host in sorted(answers) for k, v in answers[host].items()}
            events += self.algorithm.absorb_probes(self.state, round_index, results).events

        selected = sorted(self.algorithm.select(self.state, round_index, sampled, online))
        durations = {
            k: settings.profiles[k].update_duration(protocol.local_epochs * settings.client_train_sizes[k]) for k in selected
        }
        plan = plan_round(selected, durations, wanted if protocol.stragglers.policy == "over_select" else len(selected), protocol.stragglers)
        if plan.dropped:
            events.append(f"{len(plan.dropped)} of {len(selected)} selected clients missed the round (policy {protocol.stragglers.policy}): {plan.dropped}")
        object_refs = self._put_broadcast(round_index)
        handles = []
        for client_id in plan.trained:
            task = self.algorithm.training_task(self.state, round_index, client_id)
            handles.append(self.pool.submit(client_id, round_index, task, {name: object_refs[name] for name in task.models}))
        # Results are taken as they finish; the order they are applied in is fixed below.
        finished = self.pool.train_all(handles)
        metas: dict[int, UploadMeta] = {k: meta for k, (meta, _) in finished.items()}
        models_refs = {k: handle.models_ref for k, (_, handle) in finished.items()}

        uploads: list[Upload] = []
        for client_id in sorted(metas):
            meta = metas[client_id]
            if not meta.accepted:
                events.append(f"client {client_id}: update rejected (NaN/Inf); not aggregated")
                continue
            uploads.append(
                Upload(
                    client_id=client_id,
                    num_samples=meta.num_samples,
                    train_loss=meta.train_loss,
                    steps=meta.steps,
                    models=self.transport.get(models_refs[client_id]),
                    values=meta.values,
                    models_ref=models_refs[client_id],
                )
            )
        aggregate_started = time.perf_counter()
        notes = self.algorithm.aggregate(self.state, round_index, uploads)
        aggregate_seconds = time.perf_counter() - aggregate_started
        events += notes.events
        self.virtual_time = round_start + plan.round_duration
        timings = [
            UpdateTiming(
                client_id=k,
                status=("applied" if metas[k].accepted else "rejected_nonfinite") if k in metas else "dropped_late",
                virtual_start=round_start,
                virtual_finish=round_start + plan.finish_times[k],
                staleness=0,
            )
            for k in selected
        ]

        final = round_index == self.rounds
        evaluated = round_index % protocol.eval_every == 0 or final or notes.refresh is not None
        eval_reports = self._evaluate(round_index, final) if evaluated else []
        events += self.pool.take_events()
        return RoundReport(
            round_index=round_index,
            selected=selected,
            uploads=[metas[k] for k in sorted(metas)],
            eval_reports=eval_reports,
            notes=notes,
            server_seconds=time.perf_counter() - started,
            events=events,
            timings=timings,
            virtual_time=self.virtual_time,
            aggregate_seconds=aggregate_seconds,
        )

    def _evaluate(self, round_index: int, final: bool) -> list[EvalReport]:
        object_refs = self._put_broadcast(round_index)
        tasks = {k: self.algorithm.evaluation_task(self.state, round_index, k, final) for k in range(self.num_clients)}
        calls = {}
        for host_index, jobs in self._jobs_per_host(tasks).items():
            needed = {name: object_refs[name] for name in {name for job in jobs for name in job.task.models}}
            calls[host_index] = lambda jobs=jobs, needed=needed: (jobs, round_index, needed, final)
        answers = self.pool.call_per_host("evaluate", calls)
        reports = [report for host in sorted(answers) for report in answers[host]]
        return sorted(reports, key=lambda report: report.client_id)
