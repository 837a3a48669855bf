"""Does HDC-FL's private grouping see the groups the heads carry, before any noise?

Reads the saved refresh caches of runs without privacy (`output.save_refresh_cache`: every
cached client's head at each refresh) and the planted group of each client (the run's
clients table), and writes, per run at its last refresh, the ARI against the planted groups
of the groups found by:

- k-means (10 restarts) on the heads' low-rank descriptors: what HDC-FL groups by without privacy;
- k-means (10 restarts) on 8-coordinate head sketches, uncentred: the private grouping's first design;
- k-means (10 restarts) on 64-coordinate sketches centred by their mean: the current design's points;
- the releases themselves without noise, over the run's refreshes from the seeded public start
  as a private run makes them: Lloyd steps alone on the centred points, and the method's
  releases (the mean, the seeding bins, the Lloyd steps): what each loses to the iteration
  before any noise.

Each sketch column is the mean over five public sketch seeds (the run seed and four others).

    python -m studies.private_sketch_check runs/privacy/c10-nodp/*/hdcfl/* --out docs/privacy-sketch-check.md
"""

from __future__ import annotations

import argparse
from pathlib import Path
from statistics import mean

import numpy as np
import pyarrow.parquet as pq
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score

from hdcfl_ray import seeding as streams
from hdcfl_ray.hdcfl.descriptors import lowrank_descriptors, unit_normalise
from hdcfl_ray.hdcfl.private_grouping import (
    LLOYD_STEPS_PER_REFRESH,
    SKETCH_RELEASES_PER_REFRESH,
    centred_points,
    head_sketch,
    initial_centres,
    memberships_from_centres,
    private_lloyd,
    released_grouping,
    released_sketch_mean,
    sketch_axes,
)
from hdcfl_ray.logs.refresh_cache import SavedRefresh, read_refresh_caches

from analysis.runs import load_runs

SKETCH_SEEDS = 5
RESTARTS = 10


def planted_groups(run_dir: Path) -> dict[int, int]:
    table = pq.read_table(run_dir / "clients.parquet", columns=["client_id", "true_group"]).to_pylist()
    return {int(row["client_id"]): int(row["true_group"]) for row in table if row["true_group"] is not None}


def kmeans_ari(points: np.ndarray, truth: np.ndarray, groups: int) -> float:
    labels = KMeans(groups, n_init=RESTARTS, random_state=0).fit_predict(points)
    return float(adjusted_rand_score(truth, labels))


def sketches(heads: np.ndarray, seed: int, width: int) -> np.ndarray:
    axes = sketch_axes(seed, heads.shape[1], width)
    return np.stack([head_sketch(head, axes) for head in heads])


def mechanism_ari(caches: list[SavedRefresh], truth_of: dict[int, int], seed: int, groups: int, width: int, seeding: bool) -> float:
    """The releases of every refresh without noise, from the public start: the method's
    (`seeding`: mean, seeding bins, Lloyd steps) or Lloyd steps alone on the centred points."""
    centres, labels, truth = None, np.zeros(0), np.zeros(0)
    for cache in caches:
        raw = sketches(cache.heads.astype(np.float64), seed, width)
        if centres is None:
            centres = initial_centres(seed, groups, raw.shape[1])
        rngs = [np.random.default_rng([seed, cache.round_index, step]) for step in range(SKETCH_RELEASES_PER_REFRESH)]
        if seeding:
            release = released_grouping(raw, centres, 0.0, 1.0, 1, streams.int_seed(seed, "privacy_seeding", cache.round_index), rngs)
            mean_sketch, centres = release.mean, release.centres
        else:
            mean_sketch = released_sketch_mean(raw, 0.0, 1.0, rngs[0])
            centres = private_lloyd(centred_points(raw, mean_sketch), centres, len(rngs) - 1, 0.0, 1.0, 1, rngs[1:]).centres
        grouping = memberships_from_centres(dict(enumerate(raw)), mean_sketch, centres, "hard", 1.0)
        labels, truth = grouping.labels, np.array([truth_of[int(k)] for k in cache.client_ids])
    return float(adjusted_rand_score(truth, labels))


def run_row(run_dir: Path, groups: int, seed: int) -> list[str]:
    caches = read_refresh_caches(run_dir, "studies.private_sketch_check")
    last = caches[-1]
    truth_of = planted_groups(run_dir)
    truth = np.array([truth_of[int(k)] for k in last.client_ids])
    heads = last.heads.astype(np.float64)
    seeds = [seed] + [seed + offset for offset in range(1, SKETCH_SEEDS)]
    descriptor = kmeans_ari(lowrank_descriptors(heads, 8).vectors, truth, groups)
    narrow = mean(kmeans_ari(unit_normalise(sketches(heads, s, 8)), truth, groups) for s in seeds)
    wide = mean(kmeans_ari(centred_points(sketches(heads, s, 64), sketches(heads, s, 64).mean(axis=0)), truth, groups) for s in seeds)
    lloyd = mean(mechanism_ari(caches, truth_of, s, groups, 64, seeding=False) for s in seeds)
    released = mean(mechanism_ari(caches, truth_of, s, groups, 64, seeding=True) for s in seeds)
    return [run_dir.name, str(seed), str(last.round_index), str(len(truth)), *(f"{100 * v:.0f}" for v in (descriptor, narrow, wide, lloyd, released))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (or folders above them) of HDC-FL runs without privacy, with refresh caches")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    records = [r for r in load_runs(args.runs) if r.method == "hdcfl" and (r.run_dir / "refresh_cache").is_dir()]
    if not records:
        parser.error("no finished HDC-FL run with a refresh_cache/ folder under the folders given")
    rows = []
    for record in sorted(records, key=lambda r: (r.setting, r.seed)):
        groups = int(record.scenario["algorithm"]["hdcfl"]["groups"])
        rows.append([record.setting, *run_row(record.run_dir, groups, int(record.seed))])
    header = ["Setting", "Run", "Seed", "Refresh", "Clients", "Descriptor k-means", "Sketch 8, uncentred", "Sketch 64, centred", "Lloyd steps alone, no noise", "Released grouping, no noise"]
    lines = [
        "# HDC-FL's private grouping before noise: the groups its sketches carry",
        "",
        "Generated by `python -m studies.private_sketch_check " + " ".join(str(p) for p in args.runs) + f" --out {args.out}`.",
        "",
        "ARI x100 against the planted groups at each run's last refresh (k-means with 10 restarts; sketch columns: mean over "
        f"{SKETCH_SEEDS} public sketch seeds, the run seed and the next four). The last two columns run releases without noise "
        f"over the run's refreshes from the seeded public start, {SKETCH_RELEASES_PER_REFRESH} a refresh: the mean sketch, then "
        f"Lloyd steps alone, or (the method's) the seeding bins and {LLOYD_STEPS_PER_REFRESH} Lloyd steps.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
    ]
    args.out.write_text("\n".join(lines))
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
