"""The server: global encoder, the cache of every client's latest encoder and head,
one synchronous round at a time, and the algorithm's refresh hook.

`FederatedServer` is a plain object driving client host actors; `ServerActor` is
the Ray actor around it. It imports no torch: its maths are numpy functions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import ray

from hdcfl_ray.algorithms.base import Algorithm, CachedClient, ClientUpdate, Personalisation
from hdcfl_ray.runtime.messages import EvalJob, EvalReport, TrainReport
from hdcfl_ray.runtime.sampling import select_clients


@dataclass(frozen=True)
class RefreshSummary:
    round_index: int
    group_labels: dict[int, int]
    memberships: dict[int, np.ndarray]
    silhouette: float
    effective_rank: int
    num_groups: int
    descriptor_kind: str


@dataclass(frozen=True)
class RoundReport:
    round_index: int
    selected: list[int]
    train_reports: list[TrainReport]
    rejected: list[int]
    eval_reports: list[EvalReport]
    personalisation_active: bool
    refresh: RefreshSummary | None
    server_seconds: float
    group_labels: dict[int, int] = field(default_factory=dict)
    memberships: dict[int, np.ndarray] = field(default_factory=dict)


class FederatedServer:
    def __init__(
        self,
        algorithm: Algorithm,
        hosts: list,
        client_hosts: dict[int, int],
        initial_encoder: np.ndarray,
        num_clients: int,
        clients_per_round: int,
        rounds: int,
        eval_every: int,
        seed: int,
    ) -> None:
        self.algorithm = algorithm
        self.hosts = hosts
        self.client_hosts = client_hosts
        self.global_encoder = np.array(initial_encoder, dtype=np.float32, copy=True)
        self.num_clients = num_clients
        self.clients_per_round = clients_per_round
        self.rounds = rounds
        self.eval_every = eval_every
        self.seed = seed
        # Latest upload of every client: the encoder as an ObjectRef (the store
        # keeps one copy) and the head, sample count and round as small values.
        self.encoder_refs: dict[int, ray.ObjectRef] = {}
        self.cache: dict[int, CachedClient] = {}
        self.personalisation: Personalisation | None = None
        self._prototypes_ref: ray.ObjectRef | None = None

    def run_round(self, round_index: int) -> RoundReport:
        started = time.perf_counter()
        selected = select_clients(self.num_clients, self.clients_per_round, self.seed, round_index)
        global_ref = ray.put(self.global_encoder)
        round_encoder_refs: dict[int, ray.ObjectRef] = {}
        report_refs: list[ray.ObjectRef] = []
        for client_id in selected:
            host = self.hosts[self.client_hosts[client_id]]
            encoder_ref, report_ref = host.train.options(num_returns=2).remote(client_id, round_index, global_ref)
            round_encoder_refs[client_id] = encoder_ref
            report_refs.append(report_ref)
        reports: dict[int, TrainReport] = {}
        waiting = report_refs
        while waiting:
            done, waiting = ray.wait(waiting, num_returns=1)
            for report_ref in done:
                report: TrainReport = ray.get(report_ref)
                reports[report.client_id] = report
        # Aggregate in client-id order, whatever the arrival order, so a run is reproducible.
        updates: list[ClientUpdate] = []
        rejected: list[int] = []
        for client_id in sorted(reports):
            report = reports[client_id]
            encoder_ref = round_encoder_refs[client_id]
            if not report.accepted:
                rejected.append(client_id)
                continue
            encoder = ray.get(encoder_ref)
            updates.append(ClientUpdate(client_id, encoder, report.head, report.num_samples, report.train_loss))
            self.encoder_refs[client_id] = encoder_ref
            self.cache[client_id] = CachedClient(encoder, report.head, report.num_samples, round_index)
        self.global_encoder = self.algorithm.aggregate(self.global_encoder, updates)

        refresh_summary = None
        if self.algorithm.is_refresh_round(round_index):
            outcome = self.algorithm.refresh(round_index, self.global_encoder, self.cache)
            if outcome is not None:
                self.personalisation = outcome.personalisation
                self._prototypes_ref = ray.put(outcome.personalisation.prototypes)
                refresh_summary = RefreshSummary(
                    round_index=round_index,
                    group_labels=dict(outcome.personalisation.group_labels),
                    memberships=dict(outcome.personalisation.memberships),
                    silhouette=outcome.silhouette,
                    effective_rank=outcome.effective_rank,
                    num_groups=outcome.num_groups,
                    descriptor_kind=outcome.descriptor_kind,
                )

        evaluated = round_index % self.eval_every == 0 or round_index == self.rounds or refresh_summary is not None
        eval_reports = self._evaluate() if evaluated else []
        personalisation = self.personalisation if self.algorithm.uses_personalisation else None
        return RoundReport(
            round_index=round_index,
            selected=selected,
            train_reports=[reports[k] for k in sorted(reports)],
            rejected=rejected,
            eval_reports=eval_reports,
            personalisation_active=personalisation is not None,
            refresh=refresh_summary,
            server_seconds=time.perf_counter() - started,
            group_labels=dict(personalisation.group_labels) if personalisation else {},
            memberships=dict(personalisation.memberships) if personalisation else {},
        )

    def _evaluate(self) -> list[EvalReport]:
        global_ref = ray.put(self.global_encoder)
        personalisation = self.personalisation if self.algorithm.uses_personalisation else None
        jobs_per_host: dict[int, list[EvalJob]] = {}
        for client_id in range(self.num_clients):
            membership = personalisation.memberships.get(client_id) if personalisation else None
            job = EvalJob(client_id, self.encoder_refs.get(client_id), membership)
            jobs_per_host.setdefault(self.client_hosts[client_id], []).append(job)
        mix = personalisation.mix if personalisation else 0.0
        prototypes_ref = self._prototypes_ref if personalisation else None
        futures = [
            self.hosts[host_index].evaluate.remote(jobs, global_ref, prototypes_ref, mix)
            for host_index, jobs in sorted(jobs_per_host.items())
        ]
        reports = [report for batch in ray.get(futures) for report in batch]
        return sorted(reports, key=lambda report: report.client_id)

    def global_encoder_value(self) -> np.ndarray:
        return self.global_encoder

