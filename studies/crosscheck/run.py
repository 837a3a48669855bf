"""Cross-check hdcfl-ray's baselines against PFLlib on one split, seed by seed (docs/cross-check.md).

    python studies/crosscheck/run.py --pfllib PFLLIB/system --ref-python REF_VENV/bin/python \
        [--scenario scenarios/quickstart.yaml] [--methods fedavg,fedavg_se,fedbabu,fedala,local,...] \
        [--seeds 42,123,2026] [--set KEY=VALUE]... [--work runs/crosscheck] [--table FILE] \
        [--batch-order reference|ours] [--paired [--paired-rounds 3]]

For every seed it exports the scenario's clients, seeded initial model and
settings (export_split.py), then for every method runs hdcfl-ray (`hdcfl-ray
simulate`, local backend, one torch thread) and PFLlib's matching method
(pfllib_side.py, in the reference's venv), one run at a time. `--set` applies
to both sides (e.g. `--set protocol.rounds=10`). Finished runs are kept under
--work and skipped on a rerun. It prints, and with --table writes, the
comparison tables: the final-round mean over clients of each client's test
accuracy, mean ± sample std over seeds for each side, and every seed's number.
`--batch-order ours` reruns only the PFLlib side with hdcfl-ray's batches in
every local update (a diagnostic: with the sampling shared, what still differs is
arithmetic); its results are kept apart from the default ones.

`--paired` is the paired mode: both sides run the first --paired-rounds rounds
(our side evaluates every round), PFLlib with our batches, memory layout, test
batching and server average (pfllib_side.py --paired; our side scores each client
alone, `runtime.batched_evaluation=false`), and the table lists, per
method, seed and round, both mean accuracies, how many clients' accuracies are
identical and how many clients' test losses are the same float (the loss of the
model each side scores, computed as ours computes it); for Ditto and APFL also
their global models'.

Method pairs (hdcfl-ray -> PFLlib): fedavg -> FedAvg, fedavg_se -> FedPer,
fedbabu -> FedBABU, fedala -> FedALA, local -> Local, fedprox -> FedProx,
ditto -> Ditto, fedrep -> FedRep, apfl -> APFL, scaffold -> SCAFFOLD.
METHOD_SETTINGS holds the settings a pair needs on both sides (PFLlib's FedProx,
Ditto and SCAFFOLD step with plain SGD; APFL's alpha steps with the learning
rate; PFLlib's SCAFFOLD averages uniformly, so every client gets 72 training
images); a method with settings of its own gets its own export folder. For
SCAFFOLD the paired table is followed by the rounding checks: per round, how many
values PFLlib's own step, control update, Delta c and averages give differently
from ours on the same inputs.

The reference is fetched and installed outside the repository, e.g.

    git --git-dir=PFLLIB.git archive HEAD system | tar -x -C /work/ref/pfllib
    python3 -m venv /work/ref/.venv
    /work/ref/.venv/bin/pip install torch==2.14.1 torchvision==0.29.1 numpy scikit-learn h5py matplotlib
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks._common import table_provenance  # noqa: E402
from export_split import export  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
PFLLIB_SIDE = Path(__file__).resolve().parent / "pfllib_side.py"
REFERENCE_NAMES = {
    "fedavg": "FedAvg",
    "fedavg_se": "FedPer",
    "fedbabu": "FedBABU",
    "fedala": "FedALA",
    "local": "Local",
    "fedprox": "FedProx",
    "ditto": "Ditto",
    "fedrep": "FedRep",
    "apfl": "APFL",
    "scaffold": "SCAFFOLD",
}
# Settings a pair runs with on both sides, on top of the scenario and --set (docs/cross-check.md).
# PFLlib's FedProx and Ditto put the proximal term into a plain SGD step (no momentum, no weight
# decay), so both sides run them so, at lr 0.5: the step size lr / (1 - momentum) of the quickstart's
# lr 0.05 with momentum 0.9 (at the edge of stability for batches of 8: PFLlib's FedProx diverged
# at seed 42 with its own batches; see docs/cross-check.md). mu and Ditto's lambda (fixed, as
# PFLlib's is) are our defaults: a weight in the local objective, the same knob on both sides.
# PFLlib's APFL steps alpha with the learning rate, so ours gets alpha_lr = lr.
# PFLlib's SCAFFOLD steps with plain SGD too (its SCAFFOLDOptimizer) and averages y_k
# uniformly where ours weighs by samples: a test fraction that leaves every client 72
# training images makes the two means one (as run_ifca.py does for IFCA).
PLAIN_SGD = ["protocol.optimizer.lr=0.5", "protocol.optimizer.momentum=0", "protocol.optimizer.weight_decay=0"]
METHOD_SETTINGS: dict[str, list[str]] = {
    "fedprox": [*PLAIN_SGD, "algorithm.fedprox.mu=0.01"],
    "ditto": [*PLAIN_SGD, "algorithm.ditto.lambda_selection=fixed", "algorithm.ditto.proximal=0.1"],
    "apfl": ["algorithm.apfl.alpha_lr=0.05"],
    "scaffold": [*PLAIN_SGD, "dataset.test_fraction=0.1985"],
}
# Our runs evaluate every client every 5 rounds (and at the last round); evaluation changes no state.
OUR_EVAL_EVERY = 5


def clean_env() -> dict[str, str]:
    """Neither side may pick up the other's packages or a running Ray cluster."""
    return {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTHONPATH", "VIRTUAL_ENV")}


def our_run(scenario: Path, method: str, seed: int, overrides: list[str], run_dir: Path) -> Path:
    manifest = run_dir / "manifest.json"
    if manifest.is_file() and json.loads(manifest.read_text()).get("status") == "completed":
        return run_dir
    executable = Path(sys.executable).parent / "hdcfl-ray"
    if manifest.is_file():
        cmd = [str(executable), "simulate", "--resume", str(run_dir), "--quiet"]
    else:
        sets = [
            f"algorithm.name={method}",
            f"seed={seed}",
            "runtime.backend=local",
            "runtime.num_cpus=1",
            f"protocol.eval_every={OUR_EVAL_EVERY}",
            *overrides,
        ]
        cmd = [str(executable), "simulate", str(scenario), *[a for s in sets for a in ("--set", s)], "--out", str(run_dir), "--quiet"]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=REPO_ROOT, env=clean_env())
    return run_dir


def our_final(run_dir: Path) -> dict[str, Any]:
    import pyarrow.parquet as pq

    rows = pq.read_table(run_dir / "clients.parquet", columns=["round", "client_id", "accuracy", "reference"]).to_pylist()
    last = max(row["round"] for row in rows)
    final = sorted((row for row in rows if row["round"] == last), key=lambda row: row["client_id"])
    accuracies = [row["accuracy"] for row in final]
    return {
        "round": last,
        "reference": sorted({row["reference"] for row in final}),
        "client_accuracy": accuracies,
        "mean_client_accuracy": statistics.fmean(accuracies),
    }


def reference_run(ref_python: Path, pfllib: Path, root: Path, method: str, out: Path, batch_order: str,
                  paired: bool = False) -> dict[str, Any]:
    if not out.is_file():
        cmd = [str(ref_python), str(PFLLIB_SIDE), "--pfllib", str(pfllib), "--root", str(root), "--method", method,
               "--out", str(out), "--batch-order", batch_order, *(["--paired"] if paired else [])]
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, cwd=REPO_ROOT, env=clean_env())
    return json.loads(out.read_text())


def method_overrides(method: str, overrides: list[str]) -> list[str]:
    """The pair's own settings, then --set (which wins: the later --set of a key wins)."""
    return [*METHOD_SETTINGS.get(method, []), *overrides]


def export_root(work: Path, seed: int, method: str) -> Path:
    """One export per seed, and one per seed and method for a method with settings of its own."""
    return work / (f"pfllib-seed{seed}-{method}" if method in METHOD_SETTINGS else f"pfllib-seed{seed}")


def our_client_values_by_round(run_dir: Path, column: str = "accuracy") -> dict[int, list[float]]:
    """round -> every client's headline `column` (accuracy or loss), in client-id order."""
    import pyarrow.parquet as pq

    rows = pq.read_table(run_dir / "clients.parquet", columns=["round", "client_id", column]).to_pylist()
    by_round: dict[int, dict[int, float]] = {}
    for row in rows:
        by_round.setdefault(int(row["round"]), {})[int(row["client_id"])] = float(row[column])
    return {r: [value[c] for c in sorted(value)] for r, value in sorted(by_round.items())}


def paired_rows(ours: dict[int, list[float]], reference: list[list[float]], rounds: int,
                ours_loss: dict[int, list[float]] | None = None, reference_loss: list[list[float]] | None = None) -> list[dict[str, Any]]:
    """Per round t = 1..rounds: both sides' mean client accuracy, how many clients agree
    exactly and the largest per-client difference; with losses also how many clients'
    test losses are the same float and the largest loss difference. `reference[t]` is
    the reference's evaluation after t aggregations (index 0: before any)."""
    rows = []
    for t in range(1, rounds + 1):
        o, r = ours[t], reference[t]
        if len(o) != len(r):
            raise ValueError(f"round {t}: {len(o)} clients on our side, {len(r)} on the reference's")
        row = {
            "round": t,
            "ours": statistics.fmean(o),
            "reference": statistics.fmean(r),
            "identical_clients": sum(1 for a, b in zip(o, r) if a == b),
            "clients": len(o),
            "max_abs_difference": max(abs(a - b) for a, b in zip(o, r)),
        }
        if ours_loss is not None and reference_loss is not None and reference_loss[t] is not None:
            lo, lr = ours_loss[t], reference_loss[t]
            row["identical_losses"] = sum(1 for a, b in zip(lo, lr) if a == b)
            row["max_abs_loss_difference"] = max(abs(a - b) for a, b in zip(lo, lr))
        rows.append(row)
    return rows


def paired_table(results: dict[str, dict[int, list[dict[str, Any]]]]) -> str:
    lines = [
        "| method | seed | model | round | ours | PFLlib | accuracies identical | largest accuracy difference (pp) "
        "| test losses identical | largest loss difference |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for method, by_seed in results.items():
        for seed, rows in by_seed.items():
            for row in rows:
                losses = (
                    f"{row['identical_losses']}/{row['clients']} | {row['max_abs_loss_difference']:.1e}"
                    if "identical_losses" in row else "n/a | n/a"
                )
                lines.append(
                    f"| {method} / {REFERENCE_NAMES[method]} | {seed} | {row.get('model', 'scored')} | {row['round']} "
                    f"| {100 * row['ours']:.2f} "
                    f"| {100 * row['reference']:.2f} | {row['identical_clients']}/{row['clients']} "
                    f"| {100 * row['max_abs_difference']:.2f} | {losses} |"
                )
    return "\n".join(lines) + "\n"


ROUNDING_CHECKS = (
    ("step", "corrected step"),
    ("control", "c_k update"),
    ("delta_control", "Delta c"),
    ("model_average", "average of y_k"),
    ("control_average", "update of c"),
)


def rounding_table(checks: dict[str, dict[int, list[dict[str, Any]]]]) -> str:
    """SCAFFOLD's paired runs: per seed and round, how many values PFLlib's own arithmetic
    gives differently from ours on the same inputs, and the largest difference."""
    lines = [
        "| method | seed | round | " + " | ".join(label for _, label in ROUNDING_CHECKS) + " |",
        "|---|---|---|" + "---|" * len(ROUNDING_CHECKS),
    ]
    for method, by_seed in checks.items():
        for seed, rounds in by_seed.items():
            for check in rounds:
                cells = [
                    f"{check[key]['differing']}/{check[key]['values']} ({check[key]['max_abs']:.1e})"
                    for key, _ in ROUNDING_CHECKS
                ]
                lines.append(f"| {method} / {REFERENCE_NAMES[method]} | {seed} | {check['round']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else float("nan"))


def agreement_band(paired_differences: list[float]) -> float:
    """The full-run rule (docs/cross-check.md): the mean paired difference (pp) must lie
    within max(1.0, 2 * s_d / sqrt(n)), s_d the std of the per-seed differences."""
    _, spread = mean_std(paired_differences)
    return max(1.0, 2.0 * spread / len(paired_differences) ** 0.5)


def tables(results: dict[str, dict[int, dict[str, float]]], seeds: list[int]) -> str:
    """Side-by-side summary and per-seed tables, accuracies in percent."""
    lines = [
        "| method (ours / PFLlib) | ours | PFLlib | paired difference (ours - PFLlib) | band | within band | larger seed std |",
        "|---|---|---|---|---|---|---|",
    ]
    for method, by_seed in results.items():
        done = [s for s in seeds if s in by_seed]
        ours = [100 * by_seed[s]["ours"] for s in done]
        ref = [100 * by_seed[s]["pfllib"] for s in done]
        (mo, so), (mr, sr) = mean_std(ours), mean_std(ref)
        paired = [o - r for o, r in zip(ours, ref)]
        mp, sp = mean_std(paired)
        if len(done) < 2:
            band_text, verdict = "n/a", "n/a"
        else:
            band = agreement_band(paired)
            band_text, verdict = f"{band:.2f}", "yes" if abs(mp) <= band else "no"
        lines.append(
            f"| {method} / {REFERENCE_NAMES[method]} | {mo:.2f} ± {so:.2f} | {mr:.2f} ± {sr:.2f} "
            f"| {mp:+.2f} ± {sp:.2f} | {band_text} | {verdict} | {max(so, sr):.2f} |"
        )
    lines += ["", "| method | seed | ours | PFLlib | ours - PFLlib |", "|---|---|---|---|---|"]
    for method, by_seed in results.items():
        for seed in seeds:
            if seed in by_seed:
                o, r = 100 * by_seed[seed]["ours"], 100 * by_seed[seed]["pfllib"]
                lines.append(f"| {method} | {seed} | {o:.2f} | {r:.2f} | {o - r:+.2f} |")
    return "\n".join(lines) + "\n"


def run_paired(args: argparse.Namespace, methods: list[str], seeds: list[int], work: Path) -> int:
    """Both sides over the first rounds, PFLlib on our batches, layout and average."""
    rounds = args.paired_rounds
    # each client's test set scored on its own, in one batch, as the reference scores it (our
    # default scores the clients of a shared encoder together: the same accuracies, losses
    # that differ in the last bits)
    extra = [f"protocol.rounds={rounds}", "protocol.eval_every=1", "runtime.batched_evaluation=false"]
    paired_work = work / f"paired-{rounds}rounds"
    results: dict[str, dict[int, list[dict[str, Any]]]] = {m: {} for m in methods}
    checks: dict[str, dict[int, list[dict[str, Any]]]] = {m: {} for m in methods}
    for seed in seeds:
        for method in methods:
            overrides = method_overrides(method, [*args.overrides, *extra])
            root = export_root(paired_work, seed, method)
            if not (root / "dataset" / "hdcfl" / "crosscheck.json").is_file():
                export(args.scenario, [f"seed={seed}", f"algorithm.name={method}", *overrides], root)
            run_dir = our_run(args.scenario, method, seed, overrides, paired_work / "ours" / f"{method}-seed{seed}")
            ref = reference_run(args.ref_python, args.pfllib, root, method,
                                paired_work / "pfllib" / f"{method}-seed{seed}.json", "ours", paired=True)
            rows = paired_rows(
                our_client_values_by_round(run_dir), ref["client_accuracy_by_evaluation"], rounds,
                our_client_values_by_round(run_dir, "loss"), ref.get("client_loss_by_evaluation"),
            )
            for row in rows:
                row["model"] = "scored"
            if ref.get("global_client_accuracy_by_evaluation"):  # Ditto's and APFL's global model, beside
                global_rows = paired_rows(
                    our_client_values_by_round(run_dir, "accuracy_global"), ref["global_client_accuracy_by_evaluation"],
                    rounds, our_client_values_by_round(run_dir, "loss_global"), ref.get("global_client_loss_by_evaluation"),
                )
                for row in global_rows:
                    row["model"] = "global"
                rows += global_rows
            results[method][seed] = rows
            if ref.get("scaffold_checks"):  # the rounds evaluated (PFLlib trains once more after the last evaluation)
                checks[method][seed] = [check for check in ref["scaffold_checks"] if check["round"] <= rounds]
            (paired_work / "results.json").write_text(json.dumps({m: {str(s): v for s, v in r.items()} for m, r in results.items()}, indent=1))
            print(method, seed, [(r["round"], r["identical_clients"]) for r in rows], flush=True)
    text = paired_table(results)
    if any(checks.values()):
        text += "\n" + rounding_table({m: c for m, c in checks.items() if c})
    print(text)
    if args.table:
        args.table.write_text(text + "\n" + table_provenance() + "\n")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", type=Path, default=REPO_ROOT / "scenarios" / "quickstart.yaml")
    parser.add_argument("--methods", default="fedavg,fedavg_se,fedbabu,fedala,local")
    parser.add_argument("--seeds", default="42,123,2026")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--pfllib", type=Path, required=True, help="PFLlib's system/ folder")
    parser.add_argument("--ref-python", type=Path, required=True, help="python of the reference's venv")
    parser.add_argument("--work", type=Path, default=REPO_ROOT / "runs" / "crosscheck")
    parser.add_argument("--table", type=Path, help="write the tables to this file")
    parser.add_argument("--batch-order", choices=("reference", "ours"), default="reference",
                        help="ours: PFLlib reads hdcfl-ray's batches (diagnostic)")
    parser.add_argument("--paired", action="store_true", help="the paired mode over the first --paired-rounds rounds")
    parser.add_argument("--paired-rounds", type=int, default=3)
    args = parser.parse_args()

    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - set(REFERENCE_NAMES))
    if unknown:
        parser.error(f"--methods: no PFLlib pair for {', '.join(unknown)}; choose from {', '.join(REFERENCE_NAMES)}")
    seeds = [int(s) for s in args.seeds.split(",") if s]
    work = args.work.resolve()
    if args.paired:
        return run_paired(args, methods, seeds, work)
    results: dict[str, dict[int, dict[str, Any]]] = {m: {} for m in methods}
    for seed in seeds:
        for method in methods:
            overrides = method_overrides(method, args.overrides)
            root = export_root(work, seed, method)
            if not (root / "dataset" / "hdcfl" / "crosscheck.json").is_file():
                export(args.scenario, [f"seed={seed}", f"algorithm.name={method}", *overrides], root)
            run_dir = our_run(args.scenario, method, seed, overrides, work / "ours" / f"{method}-seed{seed}")
            ours = our_final(run_dir)
            suffix = "" if args.batch_order == "reference" else "-our-batch-order"
            ref_out = work / "pfllib" / f"{method}-seed{seed}{suffix}.json"
            ref = reference_run(args.ref_python, args.pfllib, root, method, ref_out, args.batch_order)
            results[method][seed] = {
                "ours": ours["mean_client_accuracy"],
                "pfllib": ref["final_mean_client_accuracy"],
                "ours_reference": ours["reference"],
                "ours_client_accuracy": ours["client_accuracy"],
                "pfllib_client_accuracy": ref["final_client_accuracy"],
            }
            (work / f"results{suffix}.json").write_text(json.dumps({m: {str(s): v for s, v in r.items()} for m, r in results.items()}, indent=1))
            print(f"{method} seed {seed}: ours {100 * ours['mean_client_accuracy']:.2f}  PFLlib {100 * ref['final_mean_client_accuracy']:.2f}", flush=True)
    text = tables(results, seeds)
    print(text)
    if args.table:
        args.table.write_text(text + "\n" + table_provenance() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
