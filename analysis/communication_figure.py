"""The report's accuracy-against-communication figure: per setting, each method's final
mean client accuracy against the bytes it moved to the final round (training jobs,
probes and updates, up plus down; analysis/run_traffic.py), means over seeds, with
one-std bars over seeds on both axes. The byte axis is logarithmic; a method that
sent nothing (Local) is drawn as a dashed line at its accuracy."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from statistics import mean, stdev

from analysis.figures import _file_part, _pyplot
from analysis.runs import RunRecord
from analysis.run_traffic import run_traffic, total_megabytes


def _points(runs: list[RunRecord]) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """setting -> method -> (MB to the final round, final mean accuracy %) per seed, for
    runs that recorded their bytes."""
    points: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        final = run.final_evaluated_round()
        if final is None or final.get("mean_accuracy") is None:
            continue
        megabytes = total_megabytes(run_traffic(run.rounds.to_pylist()))
        if not math.isnan(megabytes):
            points[run.setting][run.method].append((megabytes, 100 * float(final["mean_accuracy"])))
    return points


def _spread(values: list[float]) -> float:
    return stdev(values) if len(values) > 1 else 0.0


def accuracy_against_communication(runs: list[RunRecord], out_dir: Path) -> list[Path]:
    plt = _pyplot()
    from matplotlib.ticker import FuncFormatter
    written = []
    for setting, methods in sorted(_points(runs).items()):
        figure, axis = plt.subplots(figsize=(7.5, 4.8))
        for method, seeds in sorted(methods.items()):
            sizes, accuracies = [s for s, _ in seeds], [a for _, a in seeds]
            if mean(sizes) == 0:  # nothing sent: no place on a logarithmic axis
                axis.axhline(mean(accuracies), linestyle="--", color="grey", linewidth=1)
                axis.annotate(f"{method} (sends nothing)", (0.01, mean(accuracies)), xycoords=("axes fraction", "data"),
                              fontsize=8, color="grey", va="bottom")
                continue
            axis.errorbar(mean(sizes), mean(accuracies), xerr=_spread(sizes), yerr=_spread(accuracies), fmt="o", capsize=3)
            axis.annotate(method, (mean(sizes), mean(accuracies)), textcoords="offset points", xytext=(5, 4), fontsize=8)
        axis.set_xscale("log")
        plain = FuncFormatter(lambda value, _: f"{value:g}")  # 0.2, 30, 4000: no powers of ten
        axis.xaxis.set_major_formatter(plain)
        sent = [mean(s for s, _ in seeds) for seeds in methods.values() if mean(s for s, _ in seeds) > 0]
        if sent and max(sent) < 10 * min(sent):  # within one decade the labelled ticks are the minor ones
            axis.xaxis.set_minor_formatter(plain)
        axis.set_xlabel("MB moved to the final round (training, probes and updates; up + down)")
        axis.set_ylabel("final mean client test accuracy (%)")
        axis.set_title(f"{setting}: accuracy against communication (mean over seeds, bars: ± one std)", fontsize=10)
        axis.grid(alpha=0.3, which="both")
        figure.tight_layout()
        path = out_dir / f"communication_{_file_part(setting)}.png"
        figure.savefig(path, dpi=120)
        plt.close(figure)
        written.append(path)
    return written
