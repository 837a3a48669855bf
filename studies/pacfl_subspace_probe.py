"""Why does PACFL put every client in one cluster on a setting? Its one-shot clustering
reads the clients' data subspaces: each client's basis (per class: the top p left singular
vectors of each class's raw samples, concatenated; whole: the top p of all of them) and
the smallest principal angle between two clients' bases. Where the bases fill most of
the data's d dimensions, any two of them share directions (two subspaces of ranks r1 and
r2 in d dimensions meet in at least r1 + r2 - d of them) and every angle is 0: no
threshold splits the clients.

For the scenario's clients (its partition and seed, no training), per basis kind and p:
the bases' ranks against d, the pairwise angles (smallest, median, largest, in degrees)
and the clusters PACFL forms at each threshold of its `auto` grid, all with PACFL's own
functions.

    python -m studies.pacfl_subspace_probe scenarios/shakespeare.yaml \\
        --out docs/natural-standin-pacfl-probe.md
"""

from __future__ import annotations

import argparse
from datetime import date
from pathlib import Path

import numpy as np

from hdcfl_ray.algorithms.pacfl import AUTO_THRESHOLD_DEGREES
from hdcfl_ray.algorithms.pacfl_subspaces import (
    BasisKind,
    ProximityKind,
    agglomerative_clusters,
    client_basis,
    data_matrix,
    proximity_matrix,
)
from hdcfl_ray.config.loading import load_scenario
from hdcfl_ray.diagnostics.clustering import adjusted_rand
from hdcfl_ray.runtime.preflight import prepare_run

BASES: tuple[tuple[BasisKind, int], ...] = (("per_class", 3), ("per_class", 1), ("whole", 3), ("whole", 1))
PROXIMITIES: tuple[ProximityKind, ...] = ("principal", "elementwise")


def probe_rows(scenario_path: Path, overrides: list[str]) -> tuple[str, list[list[str]]]:
    """A line naming the setting, and one table row per basis kind, p and proximity."""
    scenario = load_scenario(scenario_path, overrides)
    prepared = prepare_run(scenario)
    dataset, clients = prepared.dataset, prepared.partition.clients
    samples = [(dataset.train_images[client.train_indices], dataset.train_labels[client.train_indices]) for client in clients]
    dimension = int(np.prod(dataset.train_images.shape[1:]))
    planted = prepared.partition.true_groups()
    setting = (
        f"`{scenario_path}` (seed {scenario.seed}): {len(clients)} clients, {dataset.num_classes} classes, "
        f"d = {dimension} input dimensions a sample"
        + ("" if planted is None else f", {len(set(planted.tolist()))} planted groups")
    )
    rows: list[list[str]] = []
    for kind, basis_dim in BASES:
        bases = [client_basis(data_matrix(images), labels, basis_dim, kind) for images, labels in samples]
        ranks = [int(np.linalg.matrix_rank(basis)) if basis.size else 0 for basis in bases]
        for proximity_kind in PROXIMITIES:
            proximity = proximity_matrix(bases, proximity_kind)
            angles = np.degrees(proximity[np.triu_indices(len(bases), k=1)])
            clusterings = [agglomerative_clusters(proximity, float(np.deg2rad(degrees)), "average") for degrees in AUTO_THRESHOLD_DEGREES]
            found = [_clusters_text(labels, planted) for labels in clusterings]
            rows.append([
                kind, str(basis_dim), proximity_kind, f"{min(ranks)}-{max(ranks)} of {dimension}",
                f"{angles.min():.2f}", f"{np.median(angles):.2f}", f"{angles.max():.2f}",
                ", ".join(f"{degrees:g}: {text}" for degrees, text in zip(AUTO_THRESHOLD_DEGREES, found)),
            ])
    return setting, rows


def _clusters_text(labels: np.ndarray, planted: np.ndarray | None) -> str:
    """How many clusters, and their ARI against the planted groups where there are some."""
    count = int(labels.max()) + 1
    if planted is None or count in (1, labels.shape[0]):
        return str(count)
    return f"{count} (ARI {adjusted_rand(planted, labels):.2f})"


def render(setting: str, rows: list[list[str]], command: str) -> str:
    header = [
        "Basis", "p", "Proximity", "Basis ranks (clients)", "Smallest angle (deg)", "Median angle (deg)",
        "Largest angle (deg)", "Clusters at each threshold of the auto grid (deg: clusters)",
    ]
    lines = [
        "# PACFL's client subspaces on one setting",
        "",
        f"Command: `{command}` ({date.today().isoformat()}). Setting: {setting}. No training: the bases are "
        "what PACFL's round-1 probe computes from each client's raw training samples.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
        "Basis ranks: the smallest and largest rank of a client's basis against the input dimension d; two bases "
        "whose ranks sum above d share at least their excess in directions, so their smallest principal angle is 0. "
        "Angles over every pair of clients; clusters by PACFL's agglomerative rule (average linkage) at each "
        "threshold its `auto` choice tries, with their ARI against the planted groups where there are some "
        "(one cluster, or one a client, has ARI 0 by construction and shows the count alone).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", type=Path)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path, help="write the markdown table here (default: print it)")
    args = parser.parse_args(argv)
    setting, rows = probe_rows(args.scenario, args.overrides)
    command = " ".join(
        ["python -m studies.pacfl_subspace_probe", str(args.scenario), *(f"--set {item}" for item in args.overrides)]
        + ([f"--out {args.out}"] if args.out else [])
    )
    text = render(setting, rows, command)
    if args.out is None:
        print(text)
    else:
        args.out.write_text(text, encoding="utf-8")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
