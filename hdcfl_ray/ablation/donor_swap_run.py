"""Donor-swap diagnostic on a finished run: replay the server cache of the last
refresh (RUN_DIR/refresh_cache/, written with output.save_refresh_cache=true),
score every (donor encoder, target head) pair on the target's test set in this
process, and hand the matrices to `donor_swap.py` for the maths."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from hdcfl_ray.contract import ModelParams
from hdcfl_ray.ablation.recorded_run import scenario_file, with_recorded_choices
from hdcfl_ray.config.loading import load_scenario
from hdcfl_ray.diagnostics.donor_swap import DonorSwapRun, DonorSwapSummary, analyse_run, beneficial, off_diagonal, summarise
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.hdcfl.descriptors import lowrank_descriptors, raw_descriptors
from hdcfl_ray.logs.refresh_cache import read_refresh_caches
from hdcfl_ray.runtime.client.client_host import ClientHost
from hdcfl_ray.runtime.backends.local_host import local_host
from hdcfl_ray.runtime.backends.ray_session import RaySession
from hdcfl_ray.runtime.preflight import prepare_run

PARQUET_NAME = "donor_swap.parquet"
_COMMAND = "diagnose donor-swap"
# a knob `auto` with no recorded choice: the run's manifest, lost or damaged, is what says it
_UNRECORDED_FIX = "restore the run's manifest.json, or rerun the simulation"


def cosine_similarity(vectors: np.ndarray) -> np.ndarray:
    """Pairwise cosine similarity of rows (a zero row has similarity 0 to everything)."""
    vectors = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit = np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)
    return unit @ unit.T


def swap_matrices(
    host: ClientHost,
    client_ids: np.ndarray,
    heads: np.ndarray,
    encoders: np.ndarray,
    round_index: int,
    max_test_samples: int | None,
) -> tuple[np.ndarray, np.ndarray]:
    """(loss_delta, acc_delta), each (T, T) [target, donor]: the score of
    (encoder_d, head_t) minus that of the reference (encoder_t, head_t)."""
    loss, accuracy = score_targets(host, list(range(len(client_ids))), client_ids, heads, encoders, round_index, max_test_samples)
    return _deltas(loss, accuracy)


def _deltas(loss: np.ndarray, accuracy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return loss - np.diag(loss)[:, None], accuracy - np.diag(accuracy)[:, None]


def score_targets(
    host: ClientHost,
    positions: list[int],
    client_ids: np.ndarray,
    heads: np.ndarray,
    encoders: np.ndarray,
    round_index: int,
    max_test_samples: int | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Loss and accuracy rows (len(positions), T) of the targets at `positions`
    paired with every donor's encoder."""
    size = len(client_ids)
    loss = np.full((len(positions), size), np.nan)
    accuracy = np.full((len(positions), size), np.nan)
    for row, target_position in enumerate(positions):
        context = host.context(int(client_ids[target_position]), round_index)
        inputs, labels = context.test_data()
        if max_test_samples is not None:
            inputs, labels = inputs[:max_test_samples], labels[:max_test_samples]
        for donor_position in range(size):
            stats = context.score(ModelParams(encoder=encoders[donor_position]), head=heads[target_position], data=(inputs, labels))
            loss[row, donor_position] = stats.loss
            accuracy[row, donor_position] = stats.accuracy
    return loss, accuracy


def _score_chunk(prepared, positions, client_ids, heads, encoders, round_index, max_test_samples):
    """A Ray task: one host for this worker, a block of targets."""
    return score_targets(local_host(prepared), positions, client_ids, heads, encoders, round_index, max_test_samples)


def swap_matrices_on_ray(prepared, client_ids, heads, encoders, round_index, max_test_samples, workers: int):
    """The same matrices, targets split over `workers` Ray tasks (one CPU each, and the
    run's GPU share: a task scores on the GPU exactly when Ray grants it one)."""
    import ray

    from hdcfl_ray.plugin_shipping import actor_options

    from hdcfl_ray.portable.ray_options import with_portable_environment

    options = {"num_cpus": 1, "num_gpus": prepared.scenario.runtime.num_gpus_per_actor, **actor_options()}
    score_chunk = ray.remote(**with_portable_environment(options, prepared.scenario.runtime.portable))(_score_chunk)
    shared = [ray.put(value) for value in (prepared, client_ids, heads, encoders)]
    chunks = [list(chunk) for chunk in np.array_split(np.arange(len(client_ids)), max(1, min(workers, len(client_ids)))) if len(chunk)]
    futures = [score_chunk.remote(shared[0], chunk, shared[1], shared[2], shared[3], round_index, max_test_samples) for chunk in chunks]
    rows = ray.get(futures)
    loss = np.concatenate([part[0] for part in rows])
    accuracy = np.concatenate([part[1] for part in rows])
    return _deltas(loss, accuracy)


def donor_swap_unit(run_dir: Path, out_dir: Path | None = None, max_test_samples: int | None = 256) -> DonorSwapRun:
    """The donor-swap quantities of one finished run with a saved refresh cache.

    `max_test_samples`: score each target on its first this-many test samples
    (None: all). With `out_dir`, writes out_dir/donor_swap.parquet, one row per
    ordered pair (target, donor), target != donor."""
    if max_test_samples is not None and (isinstance(max_test_samples, bool) or max_test_samples < 1):
        raise ValueError(f"max_test_samples must be a positive integer or None, got {max_test_samples!r}")
    run_dir = Path(run_dir)
    scenario_path = scenario_file(run_dir, _COMMAND)
    cache = read_refresh_caches(run_dir, purpose=_COMMAND)[-1]  # the final cached encoders and heads
    client_ids = cache.client_ids
    if len(client_ids) < 2:
        raise ScenarioError(f"{run_dir}: the last refresh cache holds {len(client_ids)} client(s); the diagnostic needs at least 2")

    # the method's clients are built as the run built them: its `auto` knobs at the values it chose
    scenario = with_recorded_choices(load_scenario(scenario_path), run_dir, _COMMAND, _UNRECORDED_FIX)
    prepared = prepare_run(scenario)
    # Targets are scored in parallel on Ray (the run's runtime settings start or join it).
    with RaySession(scenario.runtime) as session:
        workers = max(1, int(session.cpus // 1))
        loss_delta, acc_delta = swap_matrices_on_ray(
            prepared, client_ids, cache.heads, cache.encoders, cache.round_index, max_test_samples, workers
        )
    similarity_lowrank = cosine_similarity(lowrank_descriptors(cache.heads, rank=scenario.algorithm.hdcfl.rank).vectors)
    similarity_raw = cosine_similarity(raw_descriptors(cache.heads).vectors)
    unit = analyse_run(loss_delta, acc_delta, similarity_lowrank, similarity_raw)
    if out_dir is not None:
        write_pairs(Path(out_dir) / PARQUET_NAME, client_ids, similarity_lowrank, similarity_raw, loss_delta, acc_delta)
    return unit


def donor_swap(run_dir: Path, out_dir: Path | None = None, max_test_samples: int | None = 256) -> DonorSwapSummary:
    """The diagnostic of one run, summarised (donor_swap_runs with one run)."""
    return donor_swap_runs([run_dir], out_dir, max_test_samples)


def donor_swap_runs(run_dirs: list[Path], out_dir: Path | None = None, max_test_samples: int | None = 256) -> DonorSwapSummary:
    """The diagnostic over several runs (the seeds of one setting), summarised over
    every target x run unit as the paper's tables 4 and 14 average over targets and
    seeds. With `out_dir`, each run's pairs go to out_dir/<position>-<run folder name>/."""
    if not run_dirs:
        raise ValueError("donor_swap_runs needs at least one run")
    def pairs_folder(position: int, run_dir: Path) -> Path | None:
        if out_dir is None or len(run_dirs) == 1:
            return out_dir
        return Path(out_dir) / f"{position}-{Path(run_dir).name}"

    return summarise(
        [donor_swap_unit(Path(run_dir), pairs_folder(position, run_dir), max_test_samples) for position, run_dir in enumerate(run_dirs, start=1)]
    )


def write_pairs(
    path: Path,
    client_ids: np.ndarray,
    similarity_lowrank: np.ndarray,
    similarity_raw: np.ndarray,
    loss_delta: np.ndarray,
    acc_delta: np.ndarray,
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    mask = off_diagonal(loss_delta)
    targets, donors = np.nonzero(mask)
    table = pa.table(
        {
            "target": pa.array(client_ids[targets].astype(np.int64)),
            "donor": pa.array(client_ids[donors].astype(np.int64)),
            "similarity_lowrank": pa.array(similarity_lowrank[mask]),
            "similarity_raw": pa.array(similarity_raw[mask]),
            "loss_delta": pa.array(loss_delta[mask]),
            "acc_delta": pa.array(acc_delta[mask]),
            "beneficial": pa.array(beneficial(loss_delta)[mask]),
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def _number(value: float, digits: int = 3) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def format_summary(summary: DonorSwapSummary) -> str:
    """Table 4 quantities (with table 15's raw-head rho/AUROC) and table 14's
    quintiles with standard errors, as Markdown."""
    lines = [
        f"Donor swap ({summary.num_units} target units)",
        "",
        "| quantity | value |",
        "|---|---|",
        f"| Spearman rho (low-rank) | {_number(summary.spearman_rho)} |",
        f"| AUROC (low-rank) | {_number(summary.auroc)} |",
        f"| AP (low-rank) | {_number(summary.ap)} |",
        f"| beneficial-donor rate | {_number(summary.beneficial_rate)} |",
        f"| AP lift | {_number(summary.ap_lift)} |",
        f"| top-1 minus random (pp) | {_number(summary.top1_minus_random_pp, 2)} |",
        f"| Spearman rho (raw heads) | {_number(summary.spearman_rho_raw)} |",
        f"| AUROC (raw heads) | {_number(summary.auroc_raw)} |",
        "",
        "| head-distance quintile | accuracy gain (pp) | SE (pp) |",
        "|---|---|---|",
    ]
    for quintile, (gain, se) in enumerate(zip(summary.quintile_gain_pp, summary.quintile_se_pp), start=1):
        label = f"Q{quintile}" + (" (closest)" if quintile == 1 else " (farthest)" if quintile == len(summary.quintile_gain_pp) else "")
        lines.append(f"| {label} | {_number(float(gain), 2)} | {_number(float(se), 2)} |")
    return "\n".join(lines)
