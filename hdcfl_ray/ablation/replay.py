"""Replay a finished HDC-FL run's refreshes with other server-side settings.

HDC-FL's personalised encoders are used for inference only and never feed back
into training (docs/hdcfl.md), so every server-side variant (descriptor, rank,
groups, membership, temperature, mix, prototypes) can be scored on the caches a
run saved at its refresh rounds (`output.save_refresh_cache: true`) without
retraining. With the run's own settings the replay reproduces every score,
group and refresh diagnostic the run logged at those rounds, bit for bit (only
what training decides is absent): the cache holds each client's
latest uploaded head, which is the head the client held at that round, and a
client that never trained still holds the initial head. The run's own settings
include the values it chose for its `auto` knobs (recorded_run.py). Nothing here redoes
what the run does: the refresh (hdcfl/refresh.py), the scoring of a client
(algorithms/shared_encoder_scores.py) and the table rows (runtime/round_rows.py)
are the run's own functions."""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np

from hdcfl_ray.algorithms.shared_encoder_scores import hdcfl_evaluation
from hdcfl_ray.runtime.server.sampling import evaluation_sample
from hdcfl_ray.ablation.recorded_run import with_recorded_choices, written_scenario
from hdcfl_ray.config.loading import parse_override, scenario_to_yaml
from hdcfl_ray.config.methods import build_algorithm
from hdcfl_ray.data.partitions.newcomers import scenario_newcomers
from hdcfl_ray.contract import RefreshSummary
from hdcfl_ray.errors import ScenarioError, failure_text
from hdcfl_ray.hdcfl.refresh import refresh_summary, run_refresh
from hdcfl_ray.logs.manifest import update_manifest, write_manifest
from hdcfl_ray.portable.machine import arithmetic_facts
from hdcfl_ray.logs.refresh_cache import SavedRefresh, read_refresh_caches
from hdcfl_ray.runtime.round_rows import client_row, refresh_row, replayed_round_row
from hdcfl_ray.logs.table_writer import TableWriter
from hdcfl_ray.runtime.client.client_host import ClientHost
from hdcfl_ray.runtime.initial_model import initial_parameters
from hdcfl_ray.runtime.backends.local_host import local_host
from hdcfl_ray.runtime.server.messages import EvalReport
from hdcfl_ray.runtime.preflight import PreparedRun, prepare_run
from hdcfl_ray.runtime.trivial_references import RECORD_KEY as TRIVIAL_REFERENCES, trivial_reference_record

# What to do when a knob is `auto` and the run recorded no choice (a manifest lost or
# written before the run chose): any value of a server-side knob can be replayed.
_UNRECORDED_FIX = "give the value to replay with {set_options}"

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
    written = written_scenario(run_dir, "ablate", overrides)
    if written.algorithm.name != "hdcfl":
        raise ScenarioError(
            f"ablate {run_dir}: the run used algorithm {written.algorithm.name!r}; only hdcfl runs have refreshes to replay"
        )
    # a knob the overrides leave `auto` takes the value the run chose for it
    scenario = with_recorded_choices(written, run_dir, "ablate", _UNRECORDED_FIX)
    refreshes = read_refresh_caches(run_dir, purpose="ablate")
    _check_out_dir(out_dir)
    # what a user's settings can refuse (a method check, the data) is refused before the folder is made
    prepared = prepare_run(scenario)
    out_dir.mkdir(parents=True, exist_ok=True)

    started = time.perf_counter()
    # The replay is its own setting in reports, named after what it changed.
    (out_dir / "scenario.yaml").write_text(scenario_to_yaml(scenario.model_copy(update={"name": variant_name(scenario.name, overrides)})))
    write_manifest(
        out_dir,
        seed=scenario.seed,
        scenario_name=scenario.name,
        # the arithmetic the replay scores with, as a run records it: reports pair a replay with its run by seed
        extra={
            "status": "running",
            "ablation_of": str(run_dir),
            "overrides": overrides,
            "arithmetic": arithmetic_facts(scenario.runtime.portable),
            # the images it scores, as the run's own: the test split, or images held out of training
            "dataset": {"scored_on": "validation" if scenario.partition.validation_fraction is not None else "test"},
            # the same clients scored on the same samples as the run: its trivial references
            TRIVIAL_REFERENCES: trivial_reference_record(prepared),
        },
    )
    try:
        _replay(prepared, refreshes, out_dir, started)
    except BaseException as exc:
        update_manifest(out_dir, status="failed", error=failure_text(exc))
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


def _check_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ScenarioError(f"ablate --out {out_dir}: the folder already holds files; choose a new folder or remove it")


def _replay(prepared: PreparedRun, refreshes: list[SavedRefresh], out_dir: Path, started: float) -> None:
    """Each saved refresh goes through the run's own refresh, client scoring and row
    builders; only the settings differ."""
    scenario, dataset, partition = prepared.scenario, prepared.dataset, prepared.partition
    params = scenario.algorithm.hdcfl
    # Its schedule numbers the refreshes (and so seeds k-means) as the run's did: the
    # overrides cannot change it (check_overrides), and it counts a refresh round whose
    # cache was empty too, exactly as the run did.
    algorithm = build_algorithm(scenario)
    initial = initial_parameters(scenario, dataset)
    host = local_host(prepared, algorithm, initial)
    true_groups = partition.true_groups()
    writer = TableWriter(out_dir)
    # the clients the run scored (protocol.eval_clients: all, or its seeded sample)
    # (never its newcomers: a replay rescores the clients table, not newcomers.parquet)
    scored_clients = evaluation_sample(partition.num_clients, scenario.protocol.eval_clients, scenario.seed, scenario_newcomers(scenario))
    previous_groups: dict[int, int] | None = None
    for position, saved in enumerate(refreshes):
        round_started = time.perf_counter()
        refresh_index = algorithm.refresh_index(saved.round_index)
        result = run_refresh(saved.heads, saved.encoders, saved.num_samples, params, seed=scenario.seed, refresh_index=refresh_index)
        summary = refresh_summary(saved.round_index, saved.client_ids, result, params.descriptor)
        evaluations = _evaluate_clients(host, saved, result.prototypes, summary, initial.head, scored_clients, params.mix)
        client_rows = [client_row(saved.round_index, report, host=None, upload=None, true_groups=true_groups) for report in evaluations]
        # `position` numbers the refresh rows as the run's row builder did: one per saved cache.
        refresh = refresh_row(saved.round_index, position, summary, client_rows, previous_groups, true_groups)
        wall_time_s, elapsed_s = time.perf_counter() - round_started, time.perf_counter() - started
        round_row = replayed_round_row(saved.round_index, client_rows, true_groups, wall_time_s, elapsed_s)
        writer.write_part("clients", saved.round_index, client_rows)
        writer.write_part("refresh", saved.round_index, [refresh])
        writer.write_part("rounds", saved.round_index, [round_row])
        previous_groups = dict(summary.group_labels)


def _evaluate_clients(
    host: ClientHost,
    saved: SavedRefresh,
    prototypes: np.ndarray,
    summary: RefreshSummary,
    initial_head: np.ndarray,
    scored_clients: tuple[int, ...],
    mix: float,
) -> list[EvalReport]:
    """Every client scored by HDC-FL's own evaluation, on what it held at that round:
    its latest uploaded head and encoder (the cache); a client that never trained
    holds the initial head, has no own encoder and no membership."""
    from hdcfl_ray.runtime.client.batched_scoring import EvaluationBatch

    position_of = {int(k): i for i, k in enumerate(saved.client_ids)}
    # scored as the run's hosts score: shared encoders together (batched_scoring.py)
    batch = EvaluationBatch(host.model, host.encoder_index, host.head_index)
    if host.scenario.runtime.batched_evaluation:
        batch.share(saved.global_encoder)
        batch.share(prototypes)
    evaluated = []
    for client_id in scored_clients:
        ctx = host.context(client_id, saved.round_index, evaluation_batch=batch)
        position = position_of.get(client_id)
        cached = position is not None
        result = hdcfl_evaluation(
            ctx,
            saved.heads[position] if cached else initial_head,
            saved.global_encoder,
            own_encoder=saved.encoders[position] if cached and ctx.protocol.eval_local_reference else None,
            prototypes=prototypes if cached else None,
            membership=summary.memberships[client_id] if cached else None,
            group=summary.group_labels[client_id] if cached else None,
            mix=mix,
        )
        evaluated.append((client_id, int(ctx.test_data()[1].shape[0]), result))
    batch.flush()
    return [EvalReport(client_id=k, num_test_samples=n, result=batch.resolve(result)) for k, n, result in evaluated]
