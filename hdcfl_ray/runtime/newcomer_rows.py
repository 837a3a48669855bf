"""A round's newcomers (partition.newcomers) as rows of newcomers.parquet, and the
rounds-table columns that summarise them (docs/newcomers.md, docs/logs.md).

A newcomer of a method without a newcomer rule still has its row each evaluated
round: `rule` says "no newcomer rule" and its scores are null, never a zero."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from hdcfl_ray.diagnostics.clustering import adjusted_rand
from hdcfl_ray.diagnostics.fairness import client_accuracy_summary
from hdcfl_ray.runtime.server.messages import NewcomerReport
from hdcfl_ray.runtime.server.traffic import ClientTraffic, RoundTraffic


def newcomer_row(round_index: int, report: NewcomerReport, host: int | None, true_groups: np.ndarray | None, traffic: ClientTraffic) -> dict[str, Any]:
    """One newcomers-table row."""
    result = report.result
    headline = None if result is None else result.references[result.headline]
    return {
        "round": round_index,
        "client_id": report.client_id,
        "host": host,
        "rule": report.rule,
        "reference": None if result is None else result.headline,
        "accuracy": None if headline is None else headline.accuracy,
        "loss": None if headline is None else headline.loss,
        "accuracy_own_classes": None if headline is None else _finite_or_none(headline.accuracy_own_classes),
        "group": None if result is None else result.group,
        "memberships": None if result is None or result.memberships is None else list(result.memberships),
        "true_group": None if true_groups is None else int(true_groups[report.client_id]),
        "num_train_samples": report.num_train_samples,
        "num_test_samples": report.num_test_samples,
        "samples_trained": report.budget.samples,
        "local_steps": report.budget.steps,
        "bytes_down": traffic.down,
        "bytes_up": traffic.up,
    }


def newcomer_rows(
    round_index: int, reports: Sequence[NewcomerReport], client_hosts: dict[int, int], true_groups: np.ndarray | None, traffic: RoundTraffic
) -> list[dict[str, Any]]:
    """The round's newcomers-table rows, in client-id order (none at a round not evaluated)."""
    return [
        newcomer_row(round_index, report, client_hosts.get(report.client_id), true_groups, traffic.newcomers.get(report.client_id, ClientTraffic()))
        for report in reports
    ]


def newcomer_columns(rows: Sequence[dict[str, Any]], client_rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The rounds-table columns of a round's newcomers ({} at a round without newcomer rows):
    accuracy summaries, the ARI of their placement against the planted groups (the
    newcomers alone, and together with the evaluated clients, so that a newcomer counts as
    placed well only in its planted group's cluster), work and bytes."""
    if not rows:
        return {}
    summary = client_accuracy_summary(np.array([np.nan if row["accuracy"] is None else row["accuracy"] for row in rows], dtype=float))
    return {
        "num_newcomers": len(rows),
        "newcomer_mean_accuracy": _finite_or_none(summary["mean"]),
        "newcomer_worst_accuracy": _finite_or_none(summary["worst"]),
        "newcomer_bottom20_accuracy": _finite_or_none(summary["bottom20"]),
        "newcomer_ari_true": _placement_ari(rows),
        "newcomer_ari_with_clients": _placement_ari([*client_rows, *rows]) if client_rows else None,
        "newcomer_samples_trained": sum(row["samples_trained"] for row in rows),
        "newcomer_local_steps": sum(row["local_steps"] for row in rows),
        "newcomer_bytes_down": sum(row["bytes_down"] for row in rows),
        "newcomer_bytes_up": sum(row["bytes_up"] for row in rows),
    }


def _placement_ari(rows: Sequence[dict[str, Any]]) -> float | None:
    """ARI of the rows' groups against their planted groups (null with fewer than two placed rows)."""
    pairs = [(row["true_group"], row["group"]) for row in rows if row["group"] is not None and row["true_group"] is not None]
    if len(pairs) < 2:
        return None
    truth, found = zip(*pairs)
    return _finite_or_none(adjusted_rand(np.array(truth), np.array(found)))


def _finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
