"""Replay a finished HDC-FL run's refreshes with other server-side settings.

HDC-FL's personalised encoders are used for inference only and never feed back
into training (spec/hdcfl.md), so every server-side variant (descriptor, rank,
groups, membership, temperature, mix, prototypes) can be scored on the caches a
run saved at its refresh rounds (`output.save_refresh_cache: true`) without
retraining. With the run's own settings the replay reproduces the run's logged
global and personalised accuracies exactly: the cache holds each client's
latest uploaded head, which is the head the client held at that round, and a
client that never trained still holds the initial head."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import numpy as np

from hdcfl_ray import seeding
from hdcfl_ray.config.loading import load_scenario, parse_override, scenario_to_yaml
from hdcfl_ray.config.methods import build_algorithm
from hdcfl_ray.config.schema import Scenario
from hdcfl_ray.contract import EvalStats, ModelParams
from hdcfl_ray.diagnostics.clustering import adjusted_rand, ari_between_refreshes, membership_entropy, personalisation_gain
from hdcfl_ray.diagnostics.fairness import client_accuracy_summary
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.hdcfl.prototypes import personalised_encoder
from hdcfl_ray.hdcfl.refresh import RefreshResult, refresh_groups
from hdcfl_ray.logs.manifest import update_manifest, write_manifest
from hdcfl_ray.logs.refresh_cache import SavedRefresh, read_refresh_caches
from hdcfl_ray.logs.table_writer import TableWriter
from hdcfl_ray.runtime.client_host import ClientHost
from hdcfl_ray.runtime.initial_model import initial_parameters
from hdcfl_ray.runtime.inprocess import local_host
from hdcfl_ray.runtime.simulation import PreparedRun, prepare_run

# The refresh schedule decides at which rounds caches were saved; a replay can
# only score the rounds the run refreshed at.
_SCHEDULE_KEYS = ("activation_round", "refresh_every")


def variant_name(base: str, overrides: list[str]) -> str:
    """`quickstart` + [algorithm.hdcfl.rank=2] -> `quickstart.rank-2` (a valid scenario name)."""
    parts = []
    for text in overrides:
        key, _, value = text.partition("=")
        parts.append(f"{key.rsplit('.', 1)[-1]}-{value.strip()}")
    suffix = re.sub(r"[^A-Za-z0-9._-]+", "_", ".".join(parts)) if parts else "replay"
    return f"{base}.{suffix}"


def ablate_run(run_dir: Path, overrides: list[str], out_dir: Path) -> Path:
    """Score every saved refresh of `run_dir` with `overrides` (only `algorithm.hdcfl.*`
    keys) applied, and write a run folder `out_dir` that `hdcfl-ray report` reads.
    Returns `out_dir`."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    overrides = list(overrides)
    check_overrides(overrides)
    scenario_path = run_dir / "scenario.yaml"
    if not scenario_path.is_file():
        raise ScenarioError(f"ablate {run_dir}: not a run directory (no scenario.yaml)")
    run_scenario = load_scenario(scenario_path)
    if run_scenario.algorithm.name != "hdcfl":
        raise ScenarioError(
            f"ablate {run_dir}: the run used algorithm {run_scenario.algorithm.name!r}; only hdcfl runs have refreshes to replay"
        )
    scenario = load_scenario(scenario_path, overrides)
    refreshes = read_refresh_caches(run_dir, purpose="ablate")
    _claim_out_dir(out_dir)

    started = time.perf_counter()
    # The replay is its own setting in reports, named after what it changed.
    (out_dir / "scenario.yaml").write_text(scenario_to_yaml(scenario.model_copy(update={"name": variant_name(scenario.name, overrides)})))
    write_manifest(
        out_dir,
        seed=scenario.seed,
        scenario_name=scenario.name,
        extra={"status": "running", "ablation_of": str(run_dir), "overrides": overrides},
    )
    try:
        _replay(prepare_run(scenario), run_scenario, refreshes, out_dir, started)
    except BaseException as exc:
        update_manifest(out_dir, status="failed", error=f"{type(exc).__name__}: {exc}")
        raise
    update_manifest(out_dir, status="completed", elapsed_s=time.perf_counter() - started)
    return out_dir


def check_overrides(overrides: list[str]) -> None:
    """Only `algorithm.hdcfl.*` settings, and not the refresh schedule, change without retraining."""
    for text in overrides:
        parts, _ = parse_override(text)
        key = ".".join(parts)
        if len(parts) < 3 or parts[:2] != ["algorithm", "hdcfl"]:
            raise ScenarioError(f"ablate: only algorithm.hdcfl.* keys can change without retraining; got {key}")
        if parts[2] in _SCHEDULE_KEYS:
            raise ScenarioError(
                f"ablate: {key} changes the refresh schedule, but caches exist only at the run's refresh rounds "
                f"(rerun the simulation with the new schedule instead)"
            )


def _claim_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ScenarioError(f"ablate --out {out_dir}: the folder already holds files; choose a new folder or remove it")
    out_dir.mkdir(parents=True, exist_ok=True)


def _replay(prepared: PreparedRun, run_scenario: Scenario, refreshes: list[SavedRefresh], out_dir: Path, started: float) -> None:
    scenario, dataset, partition = prepared.scenario, prepared.dataset, prepared.partition
    algorithm = build_algorithm(scenario)
    # The run's own schedule numbers the refreshes (and so seeds k-means); it counts a
    # refresh round whose cache was empty too, exactly as the run did.
    run_schedule = build_algorithm(run_scenario)
    initial = initial_parameters(scenario, dataset)
    host = local_host(prepared, algorithm, initial)
    true_groups = partition.true_groups()
    writer = TableWriter(out_dir)
    previous_groups: dict[int, int] | None = None
    for position, saved in enumerate(refreshes):
        round_started = time.perf_counter()
        refresh_index = run_schedule.refresh_index(saved.round_index)
        result = refresh_groups(
            saved.heads, saved.encoders, saved.num_samples.astype(np.float64), scenario.algorithm.hdcfl, seed=seeding.int_seed(scenario.seed, "kmeans", refresh_index)
        )
        client_rows = _score_clients(host, scenario, saved, result, initial.head, partition.num_clients, true_groups)
        group_labels = {int(k): int(result.labels[i]) for i, k in enumerate(saved.client_ids)}
        writer.write_part("clients", saved.round_index, client_rows)
        writer.write_part("refresh", saved.round_index, [_refresh_row(saved, result, position, client_rows, previous_groups, true_groups, scenario)])
        writer.write_part(
            "rounds",
            saved.round_index,
            [_round_row(saved.round_index, client_rows, time.perf_counter() - round_started, time.perf_counter() - started)],
        )
        previous_groups = group_labels


def _score_clients(
    host: ClientHost,
    scenario: Scenario,
    saved: SavedRefresh,
    result: RefreshResult,
    initial_head: np.ndarray,
    num_clients: int,
    true_groups: np.ndarray | None,
) -> list[dict[str, Any]]:
    """Score every client as HDC-FL's evaluation does: (a) global encoder + own head,
    (b) own cached encoder + own head, (c) personalised mixture + own head; a client
    without a cache entry is scored with the global encoder only."""
    position_of = {int(k): i for i, k in enumerate(saved.client_ids)}
    mix = scenario.algorithm.hdcfl.mix
    rows = []
    for client_id in range(num_clients):
        ctx = host.context(client_id, saved.round_index)
        position = position_of.get(client_id)
        head = saved.heads[position] if position is not None else initial_head
        global_stats = ctx.score(ModelParams(saved.global_encoder), head=head)
        local_stats = personalised_stats = None
        group = memberships = None
        if position is not None:
            local_stats = ctx.score(ModelParams(saved.encoders[position]), head=head)
            membership = result.memberships[position]
            mixture = personalised_encoder(saved.global_encoder, result.prototypes, membership, mix)
            personalised_stats = ctx.score(ModelParams(mixture), head=head)
            group = int(result.labels[position])
            memberships = [float(v) for v in membership]
        headline, reference = (personalised_stats, "personalized") if personalised_stats is not None else (global_stats, "global")
        rows.append(
            {
                "round": saved.round_index,
                "client_id": client_id,
                "host": None,
                "participated": False,
                "train_loss": None,
                "num_samples": None,
                "num_test_samples": int(ctx.test_data()[1].shape[0]),
                "accuracy": headline.accuracy,
                "loss": headline.loss,
                "reference": reference,
                "accuracy_global": global_stats.accuracy,
                "loss_global": global_stats.loss,
                "accuracy_local": _stat(local_stats, "accuracy"),
                "loss_local": _stat(local_stats, "loss"),
                "accuracy_personalized": _stat(personalised_stats, "accuracy"),
                "loss_personalized": _stat(personalised_stats, "loss"),
                "group": group,
                "true_group": None if true_groups is None else int(true_groups[client_id]),
                "memberships": memberships,
            }
        )
    return rows


def _round_row(round_index: int, client_rows: list[dict[str, Any]], wall_time_s: float, elapsed_s: float) -> dict[str, Any]:
    headline = client_accuracy_summary(np.array([row["accuracy"] for row in client_rows], dtype=float))
    global_ref = client_accuracy_summary(_column(client_rows, "accuracy_global"))
    local = _column(client_rows, "accuracy_local")
    groups = [row["group"] for row in client_rows if row["group"] is not None]
    pairs = [(row["true_group"], row["group"]) for row in client_rows if row["group"] is not None and row["true_group"] is not None]
    ari_true = _finite_or_none(adjusted_rand(np.array([t for t, _ in pairs]), np.array([g for _, g in pairs]))) if len(pairs) >= 2 else None
    return {
        "round": round_index,
        "evaluated": True,
        # nothing trains in a replay
        "num_participants": None,
        "num_rejected": None,
        "num_dropped": None,
        "mean_train_loss": None,
        "mean_accuracy": headline["mean"],
        "worst_accuracy": headline["worst"],
        "bottom20_accuracy": headline["bottom20"],
        "best_accuracy": headline["best"],
        "gap": headline["gap"],
        "mean_accuracy_global": global_ref["mean"],
        "worst_accuracy_global": global_ref["worst"],
        "bottom20_accuracy_global": global_ref["bottom20"],
        "mean_accuracy_local": float(np.nanmean(local)) if np.isfinite(local).any() else None,
        "personalized": any(row["reference"] == "personalized" for row in client_rows),
        "num_groups": len(set(groups)) if groups else None,
        "ari_true": ari_true,
        "virtual_time": None,
        "wall_time_s": wall_time_s,
        "elapsed_s": elapsed_s,
    }


def _refresh_row(
    saved: SavedRefresh,
    result: RefreshResult,
    position: int,
    client_rows: list[dict[str, Any]],
    previous_groups: dict[int, int] | None,
    true_groups: np.ndarray | None,
    scenario: Scenario,
) -> dict[str, Any]:
    client_ids = [int(k) for k in saved.client_ids]
    labels = np.asarray(result.labels)
    num_groups = int(result.prototypes.shape[0])
    entropy, entropy_normalised = membership_entropy(np.asarray(result.memberships))
    ari_true = adjusted_rand(true_groups[client_ids], labels) if true_groups is not None and len(client_ids) >= 2 else None
    group_labels = {k: int(labels[i]) for i, k in enumerate(client_ids)}
    ari_previous = ari_between_refreshes(previous_groups, group_labels) if previous_groups is not None else None
    gain, helped = personalisation_gain(_column(client_rows, "accuracy_personalized"), _column(client_rows, "accuracy_global"))
    return {
        "round": saved.round_index,
        "refresh_index": position,
        "descriptor": scenario.algorithm.hdcfl.descriptor,
        "effective_rank": int(result.effective_rank),
        "num_groups": num_groups,
        "num_cached_clients": len(client_ids),
        "group_sizes": [int((labels == g).sum()) for g in range(num_groups)],
        "silhouette": _finite_or_none(result.silhouette),
        "ari_previous": _finite_or_none(ari_previous),
        "ari_true": _finite_or_none(ari_true),
        "membership_entropy": entropy,
        "membership_entropy_normalized": entropy_normalised,
        "personalization_gain": _finite_or_none(gain),
        "fraction_helped": _finite_or_none(helped),
    }


def _stat(stats: EvalStats | None, attribute: str) -> float | None:
    return None if stats is None else float(getattr(stats, attribute))


def _column(rows: list[dict[str, Any]], name: str) -> np.ndarray:
    """A float column with absent values as NaN (the summaries ignore NaN)."""
    return np.array([np.nan if row[name] is None else row[name] for row in rows], dtype=float)


def _finite_or_none(value: float | None) -> float | None:
    return float(value) if value is not None and np.isfinite(value) else None
