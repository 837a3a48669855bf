"""Newcomers at an evaluated round: every client of `partition.newcomers` (never
sampled, never in the training state) placed and scored by the method's own newcomer
rule, as if it arrived now (docs/newcomers.md). The path names no method: it runs
the hooks of `contract.newcomers` for a method that declares a rule, and reports the
absence of one for a method that does not.

Per newcomer: the method's optional probe job (answered by its `probe` hook), then its
evaluation job, answered by `evaluate_newcomer` on the newcomer's host from its
initial client state, with `protocol.newcomer_epochs` of training budget. The jobs'
bytes and the probe answers go to the traffic meter's newcomer ledger. Nothing is
committed: the server state and the newcomers' client states are left as they were,
so the rounds a run logs do not depend on whether it has newcomers' rows."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from hdcfl_ray.contract import NO_NEWCOMER_RULE, ClientTask, Method, newcomer_probe_task
from hdcfl_ray.runtime.server.host_pool import HostPool
from hdcfl_ray.runtime.server.messages import INITIAL_STATE, ClientJob, EvalReport, NewcomerReport
from hdcfl_ray.runtime.server.settings import ServerSettings
from hdcfl_ray.runtime.server.traffic import TrafficMeter


def evaluate_newcomers(
    algorithm: Method,
    state: Any,
    settings: ServerSettings,
    pool: HostPool,
    traffic: TrafficMeter,
    round_index: int,
    put_broadcast: Callable[[int], dict[str, Any]],
) -> list[NewcomerReport]:
    """Every newcomer's report at `round_index`, in client-id order (none without newcomers)."""
    newcomers = settings.newcomers
    if not newcomers:
        return []
    rule = settings.newcomer_rule
    if rule is None:  # said in every row, never a silent zero or a missing row
        return [NewcomerReport(k, NO_NEWCOMER_RULE, settings.client_train_sizes[k]) for k in newcomers]
    object_refs = put_broadcast(round_index)
    probe_tasks = {k: task for k in newcomers if (task := newcomer_probe_task(algorithm, state, round_index, k)) is not None}
    answers = _probe(probe_tasks, pool, traffic, round_index, object_refs) if probe_tasks else {}
    tasks = {k: algorithm.newcomer_task(state, round_index, k, answers.get(k)) for k in newcomers}
    for client_id, task in tasks.items():
        traffic.sent_to_newcomer(client_id, task)
    calls = {}
    epochs = settings.newcomer_epochs
    for host_index, jobs in _jobs_per_host(tasks, pool).items():
        needed = {name: object_refs[name] for name in {name for job in jobs for name in job.task.models}}
        calls[host_index] = lambda jobs=jobs, needed=needed: (jobs, round_index, needed, epochs)
    scored: dict[int, list[EvalReport]] = pool.call_per_host("evaluate_newcomers", calls)
    reports = sorted((report for host in sorted(scored) for report in scored[host]), key=lambda report: report.client_id)
    return [
        NewcomerReport(
            client_id=report.client_id,
            rule=rule,
            num_train_samples=settings.client_train_sizes[report.client_id],
            num_test_samples=report.num_test_samples,
            result=report.result,
            budget=report.budget,
        )
        for report in reports
    ]


def _jobs_per_host(tasks: Mapping[int, ClientTask], pool: HostPool) -> dict[int, list[ClientJob]]:
    """Each newcomer's job on its host, from its initial state (a newcomer never commits one)."""
    jobs: dict[int, list[ClientJob]] = {}
    for client_id in sorted(tasks):
        jobs.setdefault(pool.client_hosts[client_id], []).append(ClientJob(client_id, tasks[client_id], INITIAL_STATE))
    return jobs


def _probe(
    tasks: Mapping[int, ClientTask], pool: HostPool, traffic: TrafficMeter, round_index: int, object_refs: Mapping[str, Any]
) -> dict[int, Mapping[str, Any]]:
    """The newcomers' answers to the method's probe jobs, counted as newcomer traffic."""
    for client_id, task in tasks.items():
        traffic.sent_to_newcomer(client_id, task)
    answers = pool.call_per_host(
        "probe",
        {host: (lambda jobs=jobs: (jobs, round_index, object_refs)) for host, jobs in _jobs_per_host(tasks, pool).items()},
    )
    results = {k: v for host in sorted(answers) for k, v in answers[host].items()}
    for client_id, answer in results.items():
        traffic.received_from_newcomer(client_id, answer)
    return results
