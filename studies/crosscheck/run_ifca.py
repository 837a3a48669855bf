"""Cross-check our IFCA against the IFCA authors' code (jichan3751/ifca) on one small split (docs/cross-check.md).

    python studies/crosscheck/run_ifca.py --ifca IFCA/mnist --ref-python REF_VENV/bin/python \
        [--seeds 42,123,2026] [--paired [--paired-rounds 3]] [--work runs/crosscheck-ifca] [--table FILE]

The setting is scenarios/quickstart.yaml with IFCA_SETTINGS on top (both sides): the
reference trains each client on its whole local data as one batch with plain gradient
descent (`tau` steps of lr 0.1) and averages a cluster without sample weights, so ours
runs with batch 72 (every client's size), momentum 0, weight decay 0, lr 0.1, and a test
fraction that gives every client 72 training images (sample-weighted = unweighted).
For every seed it exports the split and our seeded cluster initialisations
(export_split.py), runs `hdcfl-ray simulate` and then the reference (ifca_side.py, in
the reference's venv), and prints the final mean client accuracy of both, per seed and
as mean ± std.

`--paired` runs the first --paired-rounds rounds with one local step (tau = 1 = one
epoch of one batch), the reference reading our batch, stepping and averaging with our
arithmetic; the table lists per seed and round how many clients got the same cluster,
the same test accuracy and the same test loss (to the bit) on both sides, and how far
the reference's own step and average were from ours on the same inputs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks._common import table_provenance  # noqa: E402
from export_split import export  # noqa: E402
from run import REPO_ROOT, agreement_band, clean_env, mean_std, our_client_values_by_round, our_final, our_run  # noqa: E402

IFCA_SIDE = Path(__file__).resolve().parent / "ifca_side.py"
IFCA_SETTINGS = [
    "algorithm.ifca.clusters=4",
    "dataset.test_fraction=0.1985",  # 1,440 training images: 72 per client
    "protocol.batch_size=72",
    "protocol.optimizer.lr=0.1",
    "protocol.optimizer.momentum=0",
    "protocol.optimizer.weight_decay=0",
    "protocol.local_epochs=10",  # the reference's tau
]


def reference_run(ref_python: Path, ifca: Path, root: Path, out: Path, paired: bool) -> dict[str, Any]:
    if not out.is_file():
        cmd = [str(ref_python), str(IFCA_SIDE), "--ifca", str(ifca), "--root", str(root), "--out", str(out),
               *(["--paired"] if paired else [])]
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, cwd=REPO_ROOT, env=clean_env())
    return json.loads(out.read_text())


def our_groups_by_round(run_dir: Path) -> dict[int, list[int]]:
    return {r: [int(g) for g in groups] for r, groups in our_client_values_by_round(run_dir, "group").items()}


def paired_ifca_rows(run_dir: Path, ref: dict[str, Any], rounds: int) -> list[dict[str, Any]]:
    accuracy, loss, groups = (our_client_values_by_round(run_dir), our_client_values_by_round(run_dir, "loss"),
                              our_groups_by_round(run_dir))
    rows = []
    for t in range(1, rounds + 1):
        ra, rl, rg = ref["client_accuracy_by_round"][t], ref["client_loss_by_round"][t], ref["assignment_by_round"][t]
        round_checks = [c for c in ref["average_checks"] if c["round"] == t]
        rows.append({
            "round": t,
            "ours": statistics.fmean(accuracy[t]),
            "reference": statistics.fmean(ra),
            "clients": len(ra),
            "same_cluster": sum(a == b for a, b in zip(groups[t], rg)),
            "same_accuracy": sum(a == b for a, b in zip(accuracy[t], ra)),
            "same_loss": sum(a == b for a, b in zip(loss[t], rl)),
            "cluster_sizes": [rg.count(j) for j in range(max(rg) + 1)],
            "average_max_abs": max((c["max_abs_difference"] for c in round_checks), default=0.0),
            "average_differing": sum(c["weights_differing"] for c in round_checks),
            "average_weights": sum(c["weights"] for c in round_checks),
        })
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", type=Path, default=REPO_ROOT / "scenarios" / "quickstart.yaml")
    parser.add_argument("--seeds", default="42,123,2026")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--ifca", type=Path, required=True, help="the reference's mnist/ folder")
    parser.add_argument("--ref-python", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=REPO_ROOT / "runs" / "crosscheck-ifca")
    parser.add_argument("--table", type=Path)
    parser.add_argument("--paired", action="store_true")
    parser.add_argument("--paired-rounds", type=int, default=3)
    args = parser.parse_args()

    seeds = [int(s) for s in args.seeds.split(",") if s]
    overrides = [*IFCA_SETTINGS, *args.overrides]
    work = args.work.resolve()
    if args.paired:
        overrides += ["protocol.local_epochs=1", f"protocol.rounds={args.paired_rounds}", "protocol.eval_every=1"]
        work = work / f"paired-{args.paired_rounds}rounds"
    lines: list[str] = []
    finals: dict[int, tuple[float, float]] = {}
    for seed in seeds:
        root = work / f"ifca-seed{seed}"
        if not (root / "dataset" / "hdcfl" / "crosscheck.json").is_file():
            export(args.scenario, [f"seed={seed}", "algorithm.name=ifca", *overrides], root)
        run_dir = our_run(args.scenario, "ifca", seed, overrides, work / "ours" / f"ifca-seed{seed}")
        ref = reference_run(args.ref_python, args.ifca, root, work / "reference" / f"ifca-seed{seed}.json", args.paired)
        if args.paired:
            for row in paired_ifca_rows(run_dir, ref, args.paired_rounds):
                lines.append(
                    f"| {seed} | {row['round']} | {100 * row['ours']:.2f} | {100 * row['reference']:.2f} "
                    f"| {row['same_cluster']}/{row['clients']} | {row['cluster_sizes']} | {row['same_accuracy']}/{row['clients']} "
                    f"| {row['same_loss']}/{row['clients']} | {row['average_differing']}/{row['average_weights']} "
                    f"({row['average_max_abs']:.1e}) |"
                )
            step = ref["step_check"]
            lines.append(f"| {seed} | step | | | | | | | reference's own step vs torch SGD's: {step['differing']}/"
                         f"{step['elements']} weights differ, largest {step['max_abs']:.1e} |")
        else:
            ours = our_final(run_dir)["mean_client_accuracy"]
            finals[seed] = (ours, ref["final_mean_client_accuracy"])
            print(f"ifca seed {seed}: ours {100 * ours:.2f}  reference {100 * ref['final_mean_client_accuracy']:.2f}", flush=True)
    if args.paired:
        header = ["| seed | round | ours | reference | same cluster | cluster sizes | same accuracy | same test loss "
                  "| reference's own average vs ours: weights differing (largest) |", "|---|---|---|---|---|---|---|---|---|"]
        text = "\n".join(header + lines) + "\n"
    else:
        ours_values = [100 * o for o, _ in finals.values()]
        ref_values = [100 * r for _, r in finals.values()]
        paired = [o - r for o, r in zip(ours_values, ref_values)]
        (mo, so), (mr, sr), (mp, sp) = mean_std(ours_values), mean_std(ref_values), mean_std(paired)
        text = "\n".join([
            "| method | ours | reference | paired difference (ours - reference) | band | within band | larger seed std |",
            "|---|---|---|---|---|---|---|",
            f"| ifca / jichan3751 IFCA | {mo:.2f} ± {so:.2f} | {mr:.2f} ± {sr:.2f} | {mp:+.2f} ± {sp:.2f} "
            f"| {agreement_band(paired):.2f} | {'yes' if abs(mp) <= agreement_band(paired) else 'no'} | {max(so, sr):.2f} |",
            "",
            "| seed | ours | reference | ours - reference |",
            "|---|---|---|---|",
            *[f"| {s} | {100 * o:.2f} | {100 * r:.2f} | {100 * (o - r):+.2f} |" for s, (o, r) in finals.items()],
        ]) + "\n"
    print(text)
    if args.table:
        args.table.write_text(text + "\n" + table_provenance() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
