"""The synchronous server: runs one round at a time through the method's hooks.

It picks the round's clients (`sampling`, on the virtual clock; under
privacy.sampling: poisson, each training client with rate q), puts each
broadcast object (the global encoder, prototypes, cluster models) in the object
store once per round and sends ObjectRefs, collects the clients' updates as they
finish and hands them to the method in client-id order, so a run is reproducible
whatever the arrival order; updates holding NaN/Inf are left out. Under privacy
the method's releases are accounted after its aggregate (`privacy_ledger`), and a
round after which the next round's release would pass privacy.max_epsilon is the
run's last. The round ends in `round_tail`, shared with the asynchronous server. `FederatedServer` is a
plain object; `ServerActor` (runtime/backends/actors.py) is the Ray actor around
it. It imports no torch.
"""

from __future__ import annotations

import time
from typing import Any

from hdcfl_ray.contract import ClientTask, Method, ModelParams, RoundNotes, Upload, asks_for_probes
from hdcfl_ray.runtime.server.host_pool import HostPool
from hdcfl_ray.runtime.server.messages import ClientJob, EvalReport, NewcomerReport, UploadMeta
from hdcfl_ray.runtime.server.newcomers import evaluate_newcomers
from hdcfl_ray.runtime.server.privacy_ledger import PrivacyLedger
from hdcfl_ray.runtime.server.round_tail import RoundReport, UpdateTiming, accepted_upload, close_round
from hdcfl_ray.runtime.server.sampling import available_clients, plan_round, poisson_sample, select_clients, selection_size
from hdcfl_ray.runtime.server.settings import ServerSettings
from hdcfl_ray.runtime.server.traffic import TrafficMeter
from hdcfl_ray.runtime.server.transport import RayTransport, Transport


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
        # a method without a probe hook of its own is not asked about every client every round
        self._probes = asks_for_probes(algorithm)
        self.traffic = TrafficMeter(self.transport)  # each client's bytes, reported with the round
        # the releases the method reported under privacy, and the epsilon they spent
        self.privacy_ledger = PrivacyLedger(settings.privacy) if settings.privacy is not None else None

    def encoder_size(self) -> int:
        """Floats in the encoder vector (for the manifest)."""
        return self._encoder_size

    def host_handles(self) -> list:
        """The hosts now serving (replacements included), e.g. to shut them down."""
        return list(self.pool.hosts)

    def refresh_cache(self) -> dict[str, Any] | None:
        """The arrays the method exports after this round's aggregation (its optional
        `export_cache` hook; output.save_refresh_cache writes them at each refresh), or None."""
        export = getattr(self.algorithm, "export_cache", None)
        return None if export is None else export(self.state)

    def privacy_releases(self) -> list[tuple[float, float, int]]:
        """The releases accounted so far under privacy (for the manifest); [] without privacy."""
        return [] if self.privacy_ledger is None else self.privacy_ledger.snapshot()

    # ---- checkpoints ----
    def snapshot(self) -> dict[str, Any]:
        """Everything needed to continue after the last finished round."""
        snapshot = {"state": self.state, "virtual_time": self.virtual_time, "client_states": dict(self.pool.state_refs)}
        if self.privacy_ledger is not None:  # a resumed run goes on from the epsilon it had spent
            snapshot["privacy_releases"] = self.privacy_ledger.snapshot()
        return snapshot

    def restore(self, snapshot: dict[str, Any]) -> None:
        from hdcfl_ray.checkpoint.codec import writable

        # on Ray the snapshot comes through the object store: its arrays are read-only
        self.state = writable(snapshot["state"])
        self.virtual_time = snapshot["virtual_time"]
        self.pool.state_refs = dict(snapshot["client_states"])
        if self.privacy_ledger is not None:
            self.privacy_ledger.restore(snapshot.get("privacy_releases", []))

    def _put_broadcast(self, round_index: int) -> dict[str, Any]:
        objects = self.algorithm.broadcast(self.state, round_index)
        self.traffic.broadcast(objects)
        return {name: self.transport.put(value) for name, value in objects.items()}

    def _jobs_per_host(self, tasks: dict[int, ClientTask]) -> dict[int, list[ClientJob]]:
        jobs: dict[int, list[ClientJob]] = {}
        for client_id in sorted(tasks):
            job = ClientJob(client_id, tasks[client_id], self.pool.state_of(client_id))
            jobs.setdefault(self.client_hosts[client_id], []).append(job)
        return jobs

    def probe_round(self, round_index: int) -> RoundNotes:
        """The round's probes (the clients the method asks about before it selects): asked,
        answered and absorbed into the method's state; the method's notes on them (events,
        under privacy the releases it made). Also the first step of an auto knob whose
        values a probe tells apart (auto_knobs/choose.py)."""
        probe_tasks = (
            {
                k: t
                for k in self.settings.training_clients(list(range(self.num_clients)))  # newcomers never enter the training state
                if (t := self.algorithm.probe_task(self.state, round_index, k)) is not None
            }
            if self._probes
            else {}
        )
        if not probe_tasks:
            return RoundNotes()
        object_refs = self._put_broadcast(round_index)
        for client_id, task in probe_tasks.items():
            self.traffic.sent(client_id, task)
        answers = self.pool.call_per_host(
            "probe",
            {host: (lambda jobs=jobs: (jobs, round_index, object_refs)) for host, jobs in self._jobs_per_host(probe_tasks).items()},
        )
        results = {k: v for host in sorted(answers) for k, v in answers[host].items()}
        for client_id, answer in results.items():
            self.traffic.received(client_id, answer)
        return self.algorithm.absorb_probes(self.state, round_index, results)

    def run_round(self, round_index: int) -> RoundReport:
        started = time.perf_counter()
        events: list[str] = []
        settings = self.settings
        protocol = settings.protocol
        round_start = self.virtual_time
        online = settings.available_at(available_clients(self.num_clients, protocol.availability, self.seed, round_index), round_start)
        online = settings.training_clients(online)  # newcomers are never sampled
        privacy = settings.privacy
        if privacy is not None and privacy.sampling == "poisson":  # each training client with rate q, none at times
            sampled = poisson_sample(self.num_clients, privacy.sample_rate, self.seed, round_index, online)
            wanted = len(sampled)
            if not sampled:
                events.append("privacy.sampling: poisson drew no client this round; the method releases its noise alone")
        else:
            wanted = min(settings.clients_per_round, len(online))
            sampled = select_clients(
                self.num_clients, selection_size(settings.clients_per_round, protocol.stragglers, len(online)), self.seed, round_index, online
            )
        if not online:
            events.append("no client is available this round; the global state is unchanged")

        probe_notes = self.probe_round(round_index)
        events += probe_notes.events

        selected = sorted(self.algorithm.select(self.state, round_index, sampled, online))
        durations = {
            k: settings.profiles[k].update_duration(protocol.local_epochs * settings.client_train_sizes[k]) for k in selected
        }
        plan = plan_round(selected, durations, wanted if protocol.stragglers.policy == "over_select" else len(selected), protocol.stragglers)
        if plan.dropped:
            events.append(f"{len(plan.dropped)} of {len(selected)} selected clients missed the round (policy {protocol.stragglers.policy}): {plan.dropped}")
        object_refs = self._put_broadcast(round_index)
        entries = []
        for client_id in plan.trained:
            task = self.algorithm.training_task(self.state, round_index, client_id)
            self.traffic.sent(client_id, task)
            entries.append((client_id, round_index, task, {name: object_refs[name] for name in task.models}))
        if settings.batched_training:  # one call per host with all its clients, so they train together
            entries_of_host: dict[int, list[tuple[int, int, ClientTask, dict[str, Any]]]] = {}
            for entry in entries:
                entries_of_host.setdefault(self.client_hosts[entry[0]], []).append(entry)
            handles = [handle for host in sorted(entries_of_host) for handle in self.pool.submit_many(entries_of_host[host])]
        else:
            handles = [self.pool.submit(*entry) for entry in entries]
        # Results are taken as they finish; the order they are applied in is fixed below.
        finished = self.pool.train_all(handles)
        metas: dict[int, UploadMeta] = {k: meta for k, (meta, _) in finished.items()}
        for client_id, (meta, handle) in finished.items():
            self.traffic.received_update(client_id, meta, handle.models_ref)

        uploads: list[Upload] = []
        for client_id in sorted(finished):
            upload = accepted_upload(*finished[client_id], self.transport, events, not_taken="not aggregated")
            if upload is not None:
                uploads.append(upload)
        aggregate_started = time.perf_counter()
        # under privacy also with no upload at all: the method's aggregate releases the noise
        notes = self.algorithm.aggregate(self.state, round_index, uploads)
        aggregate_seconds = time.perf_counter() - aggregate_started
        events += notes.events
        epsilon, stop = self._account_privacy(round_index, (*probe_notes.releases, *notes.releases), events)
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
        return close_round(
            self, round_index, started, selected=selected, uploads=[metas[k] for k in sorted(metas)], notes=notes,
            events=events, timings=timings, aggregate_seconds=aggregate_seconds, epsilon=epsilon, stop_reason=stop,
        )

    def _account_privacy(
        self, round_index: int, releases: tuple[tuple[float, float, int], ...], events: list[str]
    ) -> tuple[float | None, str | None]:
        """Under privacy: the epsilon spent once this round's releases are counted, and why
        the run ends after this round (the next round's release would pass
        privacy.max_epsilon), or None; (None, None) without privacy."""
        ledger = self.privacy_ledger
        if ledger is None:
            return None, None
        if not releases and ledger.privacy.planned_releases(round_index):
            events.append(f"privacy: {self.algorithm.name} reported no release this round although its privacy rule plans one")
        epsilon = ledger.record(releases)
        stop = ledger.stop_before(round_index + 1) if round_index < self.rounds else None
        if stop is not None:
            events.append(stop)
        return epsilon, stop

    def evaluate_clients(self, round_index: int, final: bool) -> list[EvalReport]:
        """The evaluation of every client in `protocol.eval_clients` (all by default), in
        client-id order (`close_round` decides when)."""
        object_refs = self._put_broadcast(round_index)
        tasks = {k: self.algorithm.evaluation_task(self.state, round_index, k, final) for k in self.settings.eval_client_ids}
        for client_id, task in tasks.items():
            self.traffic.sent_for_evaluation(client_id, task)
        calls = {}
        for host_index, jobs in self._jobs_per_host(tasks).items():
            needed = {name: object_refs[name] for name in {name for job in jobs for name in job.task.models}}
            calls[host_index] = lambda jobs=jobs, needed=needed: (jobs, round_index, needed, final)
        answers = self.pool.call_per_host("evaluate", calls)
        reports = [report for host in sorted(answers) for report in answers[host]]
        return sorted(reports, key=lambda report: report.client_id)

    def evaluate_newcomers(self, round_index: int) -> list[NewcomerReport]:
        """Every newcomer (partition.newcomers) placed and scored by the method's newcomer
        rule, in client-id order (`close_round` decides when: with the clients' evaluation)."""
        return evaluate_newcomers(self.algorithm, self.state, self.settings, self.pool, self.traffic, round_index, self._put_broadcast)
