"""Turn one round's report into rows of the clients, rounds, refresh, updates and
events tables.

A client's headline `accuracy` is the reference its method names in
`EvalResult.headline` (docs/logs.md); the `global`, `local` and `personalized`
references are logged beside it when the method produces them.

The clients-row, evaluation-column and refresh-row builders are plain functions:
`RoundRowBuilder` calls them for a run, and `ablate`'s replay (ablation/replay.py)
for the rounds it rescores, so both write the same rows from the same scores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hdcfl_ray.contract import EvalStats
from hdcfl_ray.diagnostics.clustering import adjusted_rand, ari_between_refreshes, membership_entropy, personalisation_gain
from hdcfl_ray.diagnostics.fairness import client_accuracy_summary
from hdcfl_ray.contract import RefreshSummary
from hdcfl_ray.runtime.newcomer_rows import newcomer_columns, newcomer_rows
from hdcfl_ray.runtime.server.messages import EvalReport, UploadMeta
from hdcfl_ray.runtime.server.round_tail import RoundReport
from hdcfl_ray.runtime.server.traffic import ClientTraffic

# Absent values (a client that never trained, a first refresh with no previous one)
# are written as nulls, not NaN, so readers can tell "not applicable" from a number.
ABSENT = None


def _stat(stats: EvalStats | None, attribute: str) -> float | None:
    return ABSENT if stats is None else float(getattr(stats, attribute))


def client_row(
    round_index: int,
    evaluation: EvalReport,
    host: int | None,
    upload: UploadMeta | None,
    true_groups: np.ndarray | None,
    traffic: ClientTraffic | None = None,
) -> dict[str, Any]:
    """One clients-table row: the client's evaluation, its update if it trained this round,
    and the bytes it moved this round (`traffic`; null where nothing was counted, as in a replay)."""
    client_id = evaluation.client_id
    result = evaluation.result
    references = result.references
    headline = references[result.headline]
    return {
        "round": round_index,
        "client_id": client_id,
        "host": host,
        "participated": upload is not None,
        "train_loss": ABSENT if upload is None else upload.train_loss,
        "num_samples": None if upload is None else upload.num_samples,
        "num_test_samples": evaluation.num_test_samples,
        "accuracy": headline.accuracy,
        "loss": headline.loss,
        "accuracy_own_classes": _finite_or_nan(headline.accuracy_own_classes),
        "reference": result.headline,
        "accuracy_global": _stat(references.get("global"), "accuracy"),
        "loss_global": _stat(references.get("global"), "loss"),
        "accuracy_local": _stat(references.get("local"), "accuracy"),
        "loss_local": _stat(references.get("local"), "loss"),
        "accuracy_personalized": _stat(references.get("personalized"), "accuracy"),
        "loss_personalized": _stat(references.get("personalized"), "loss"),
        "group": result.group,
        "true_group": None if true_groups is None else int(true_groups[client_id]),
        "memberships": None if result.memberships is None else list(result.memberships),
        "bytes_up": None if traffic is None else traffic.up,
        "bytes_down": None if traffic is None else traffic.down,
        "eval_bytes_down": None if traffic is None else traffic.eval_down,
    }


def evaluation_columns(client_rows: list[dict[str, Any]], true_groups: np.ndarray | None) -> dict[str, Any]:
    """The rounds-table columns a round's (non-empty) client rows decide: accuracy
    summaries over clients, the number of groups found and their ARI with the planted ones."""
    headline = client_accuracy_summary(np.array([r["accuracy"] for r in client_rows], dtype=float))
    global_ref = client_accuracy_summary(_column(client_rows, "accuracy_global"))
    local = _column(client_rows, "accuracy_local")
    groups = [r["group"] for r in client_rows if r["group"] is not None]
    return {
        "num_evaluated": len(client_rows),
        "mean_accuracy": headline["mean"],
        "worst_accuracy": headline["worst"],
        "bottom20_accuracy": headline["bottom20"],
        "best_accuracy": headline["best"],
        "gap": headline["gap"],
        "mean_accuracy_global": global_ref["mean"],
        "worst_accuracy_global": global_ref["worst"],
        "bottom20_accuracy_global": global_ref["bottom20"],
        "mean_accuracy_local": float(np.nanmean(local)) if np.isfinite(local).any() else ABSENT,
        "mean_accuracy_own_classes": _nanmean_or_absent(_column(client_rows, "accuracy_own_classes")),
        "num_groups": len(set(groups)) if groups else None,
        "ari_true": _ari_true(client_rows, true_groups),
    }


def replayed_round_row(
    round_index: int, client_rows: list[dict[str, Any]], true_groups: np.ndarray | None, wall_time_s: float, elapsed_s: float
) -> dict[str, Any]:
    """A rounds-table row for a round rescored without training (`ablate`): the
    training and virtual-clock columns are absent, the evaluation columns as in a run."""
    return {
        "round": round_index,
        "evaluated": bool(client_rows),
        "personalized": any(row["reference"] == "personalized" for row in client_rows),
        "wall_time_s": wall_time_s,
        "elapsed_s": elapsed_s,
        **(evaluation_columns(client_rows, true_groups) if client_rows else {}),
    }


def refresh_row(
    round_index: int,
    refresh_index: int,
    refresh: RefreshSummary,
    client_rows: list[dict[str, Any]],
    previous_groups: dict[int, int] | None,
    true_groups: np.ndarray | None,
) -> dict[str, Any]:
    """One refresh-table row: the grouping, its agreement with the previous refresh's
    (`previous_groups`, None at the first) and the planted groups, and the gain of the
    personalised encoders over the global one in `client_rows`."""
    client_ids = sorted(refresh.group_labels)
    labels = np.array([refresh.group_labels[k] for k in client_ids])
    memberships = np.stack([refresh.memberships[k] for k in client_ids])
    entropy, entropy_normalised = membership_entropy(memberships)
    ari_true = ABSENT
    if true_groups is not None and len(client_ids) >= 2:
        ari_true = adjusted_rand(true_groups[client_ids], labels)
    ari_previous = ABSENT
    if previous_groups is not None:
        ari_previous = ari_between_refreshes(previous_groups, refresh.group_labels)
    personalised = _column(client_rows, "accuracy_personalized")
    global_acc = _column(client_rows, "accuracy_global")
    gain, helped = personalisation_gain(personalised, global_acc) if client_rows else (ABSENT, ABSENT)
    return {
        "round": round_index,
        "refresh_index": refresh_index,
        "descriptor": refresh.descriptor_kind,
        "effective_rank": refresh.effective_rank,
        "num_groups": refresh.num_groups,
        "num_cached_clients": len(client_ids),
        "group_sizes": [int((labels == g).sum()) for g in range(refresh.num_groups)],
        "silhouette": _finite_or_nan(refresh.silhouette),
        "ari_previous": _finite_or_nan(ari_previous),
        "ari_true": _finite_or_nan(ari_true),
        "membership_entropy": entropy,
        "membership_entropy_normalized": entropy_normalised,
        "personalization_gain": _finite_or_nan(gain),
        "fraction_helped": _finite_or_nan(helped),
    }


@dataclass
class RoundRowBuilder:
    """Keeps what diagnostics need across rounds (the previous refresh's groups)."""

    client_hosts: dict[int, int]
    true_groups: np.ndarray | None
    previous_groups: dict[int, int] | None = None
    refresh_count: int = 0
    last_summary: dict[str, Any] = field(default_factory=dict)

    def progress(self) -> dict[str, Any]:
        """What a checkpoint must keep of this builder."""
        return {"previous_groups": self.previous_groups, "refresh_count": self.refresh_count}

    def restore(self, progress: dict[str, Any]) -> None:
        self.previous_groups = progress["previous_groups"]
        self.refresh_count = progress["refresh_count"]

    def client_rows(self, report: RoundReport) -> list[dict[str, Any]]:
        trained = {upload.client_id: upload for upload in report.uploads}
        return [
            client_row(
                report.round_index,
                evaluation,
                host=self.client_hosts[evaluation.client_id],
                upload=trained.get(evaluation.client_id),
                true_groups=self.true_groups,
                traffic=report.traffic.of(evaluation.client_id),
            )
            for evaluation in report.eval_reports
        ]

    def round_row(self, report: RoundReport, client_rows: list[dict[str, Any]], wall_time_s: float, elapsed_s: float) -> dict[str, Any]:
        losses = [upload.train_loss for upload in report.uploads if upload.accepted]
        row: dict[str, Any] = {
            "round": report.round_index,
            "evaluated": bool(client_rows),
            "num_participants": len(report.uploads),
            "num_rejected": sum(1 for upload in report.uploads if not upload.accepted),
            "num_dropped": sum(1 for timing in report.timings if timing.status == "dropped_late"),
            # training work, counted by the runtime: rejected updates were trained too
            "samples_trained": sum(upload.budget.samples for upload in report.uploads),
            "local_steps": sum(upload.budget.steps for upload in report.uploads),
            "eval_samples_trained": sum(evaluation.budget.samples for evaluation in report.eval_reports),
            "eval_local_steps": sum(evaluation.budget.steps for evaluation in report.eval_reports),
            # every client's bytes, evaluated or not (the clients table holds the evaluated ones)
            "bytes_up": report.traffic.up,
            "bytes_down": report.traffic.down,
            "eval_bytes_down": report.traffic.eval_down,
            "virtual_time": report.virtual_time,
            "mean_train_loss": float(np.mean(losses)) if losses else ABSENT,
            "personalized": any(row["reference"] == "personalized" for row in client_rows),
            "wall_time_s": wall_time_s,
            "aggregate_s": report.aggregate_seconds,
            "elapsed_s": elapsed_s,
            "epsilon": report.epsilon,  # privacy spent so far (null without privacy)
        }
        if client_rows:
            row.update(evaluation_columns(client_rows, self.true_groups))
        row.update(newcomer_columns(self.newcomer_rows(report), client_rows))
        if client_rows:
            self.last_summary = dict(row)
        return row

    def newcomer_rows(self, report: RoundReport) -> list[dict[str, Any]]:
        """The round's newcomers-table rows (partition.newcomers; none at a round not evaluated)."""
        return newcomer_rows(report.round_index, report.newcomers, self.client_hosts, self.true_groups, report.traffic)

    def refresh_row(self, report: RoundReport, client_rows: list[dict[str, Any]]) -> dict[str, Any] | None:
        refresh = report.notes.refresh
        if refresh is None:
            return None
        row = refresh_row(report.round_index, self.refresh_count, refresh, client_rows, self.previous_groups, self.true_groups)
        self.previous_groups = dict(refresh.group_labels)
        self.refresh_count += 1
        return row

    @staticmethod
    def event_rows(report: RoundReport) -> list[dict[str, Any]]:
        return [{"round": report.round_index, "message": message} for message in report.events]

    @staticmethod
    def update_rows(report: RoundReport, client_hosts: dict[int, int] | None = None) -> list[dict[str, Any]]:
        """One row per client update of the round; `client_hosts` (client -> host) names
        the host that ran each."""
        uploads = {upload.client_id: upload for upload in report.uploads}
        rows = []
        for timing in report.timings:
            upload = uploads.get(timing.client_id)
            rows.append(
                {
                    "round": report.round_index,
                    "client_id": timing.client_id,
                    "status": timing.status,
                    "virtual_start": timing.virtual_start,
                    "virtual_finish": timing.virtual_finish,
                    "staleness": timing.staleness,
                    "train_loss": None if upload is None else upload.train_loss,
                    "num_samples": None if upload is None else upload.num_samples,
                    "steps": None if upload is None else upload.steps,
                    "samples_trained": None if upload is None else upload.budget.samples,
                    "local_steps": None if upload is None else upload.budget.steps,
                    "host": None if client_hosts is None else client_hosts.get(timing.client_id),
                    "trained_together": None if upload is None else getattr(upload, "trained_together", 1),
                }
            )
        return rows


def _ari_true(client_rows: list[dict[str, Any]], true_groups: np.ndarray | None) -> float | None:
    """ARI of the clients' current groups against the planted ones (any method with clusters)."""
    pairs = [(r["true_group"], r["group"]) for r in client_rows if r["group"] is not None and r["true_group"] is not None]
    if true_groups is None or len(pairs) < 2:
        return None
    truth, found = zip(*pairs)
    return _finite_or_nan(adjusted_rand(np.array(truth), np.array(found)))


def _column(rows: list[dict[str, Any]], name: str) -> np.ndarray:
    """A float column with absent values as NaN (the maths ignore NaN)."""
    return np.array([np.nan if row[name] is None else row[name] for row in rows], dtype=float)


def _nanmean_or_absent(values: np.ndarray) -> float | None:
    return float(np.nanmean(values)) if np.isfinite(values).any() else ABSENT


def _finite_or_nan(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
