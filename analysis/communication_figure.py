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

from analysis.figure_files import file_part, pyplot, save_figure
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


MARKERS = ("o", "s", "^", "D")
# points closer than this on the logarithmic byte axis (decades) share a column of labels
SAME_COLUMN_DECADES = 0.05


def _label_heights(points: list[tuple[float, float]], gap: float) -> list[float]:
    """A label height for each (MB, accuracy) point: points in one column of the byte
    axis (methods that send about the same) get labels at least `gap` apart, in the
    order of their accuracies; each crowd of labels is centred on its points, and a
    point far from the others keeps its label at its own height."""
    heights = [accuracy for _, accuracy in points]
    order = sorted(range(len(points)), key=lambda i: (math.log10(points[i][0]), points[i][1]))
    columns: list[list[int]] = []
    for index in order:
        if columns and math.log10(points[index][0]) - math.log10(points[columns[-1][0]][0]) < SAME_COLUMN_DECADES:
            columns[-1].append(index)
        else:
            columns.append([index])
    for column in columns:
        crowds = [[index] for index in sorted(column, key=lambda i: points[i][1])]
        while True:  # merge neighbouring crowds whose spread labels would overlap
            placed = [_spread_evenly([points[i][1] for i in crowd], gap) for crowd in crowds]
            overlap = next((k for k in range(len(crowds) - 1) if placed[k][-1] + gap > placed[k + 1][0]), None)
            if overlap is None:
                break
            crowds[overlap:overlap + 2] = [crowds[overlap] + crowds[overlap + 1]]
        for crowd, crowd_heights in zip(crowds, placed):
            for index, height in zip(crowd, crowd_heights):
                heights[index] = height
    return heights


def _spread_evenly(accuracies: list[float], gap: float) -> list[float]:
    """Heights for ascending `accuracies`, at least `gap` apart, centred on them."""
    placed = [accuracies[0]]
    for accuracy in accuracies[1:]:
        placed.append(max(accuracy, placed[-1] + gap))
    shift = (sum(placed) - sum(accuracies)) / len(accuracies)
    return [height - shift for height in placed]


def accuracy_against_communication(runs: list[RunRecord], out_dir: Path) -> list[Path]:
    from matplotlib.ticker import FuncFormatter

    plt = pyplot()
    colours = plt.get_cmap("tab10")
    written = []
    for setting, methods in sorted(_points(runs).items()):
        figure, axis = plt.subplots(figsize=(8, 5.2))
        summary = {m: (mean(s for s, _ in seeds), mean(a for _, a in seeds)) for m, seeds in sorted(methods.items())}
        accuracies = [accuracy for _, accuracy in summary.values()]
        gap = 0.045 * max(max(accuracies) - min(accuracies), 1.0)
        drawn = [m for m, (size, _) in summary.items() if size > 0]
        heights = dict(zip(drawn, _label_heights([summary[m] for m in drawn], gap)))
        for index, (method, (size, accuracy)) in enumerate(summary.items()):
            seeds = methods[method]
            if size == 0:  # nothing sent: no place on a logarithmic axis
                axis.axhline(accuracy, linestyle="--", color="grey", linewidth=1)
                axis.annotate(f"{method} (sends nothing)", (0.99, accuracy), xycoords=("axes fraction", "data"),
                              fontsize=8, color="grey", ha="right", va="bottom")
                continue
            colour, marker = colours(index % 10), MARKERS[index // 10 % len(MARKERS)]  # 14 methods: 10 colours
            axis.errorbar(size, accuracy, xerr=_spread([s for s, _ in seeds]), yerr=_spread([a for _, a in seeds]),
                          fmt=marker, capsize=3, color=colour)
            axis.annotate(method, (size, accuracy), xytext=(size * 1.08, heights[method]), fontsize=8, va="center",
                          color=colour, arrowprops={"arrowstyle": "-", "color": colour, "linewidth": 0.5})
        axis.set_xscale("log")
        plain = FuncFormatter(lambda value, _: f"{value:g}")  # 0.2, 30, 4000: no powers of ten
        axis.xaxis.set_major_formatter(plain)
        sent = [summary[m][0] for m in drawn]
        if sent and max(sent) < 10 * min(sent):  # within one decade the labelled ticks are the minor ones
            axis.xaxis.set_minor_formatter(plain)
        if sent:  # room on the right for the labels of the method that sends most
            axis.set_xlim(right=max(sent) * 1.6)
        axis.set_xlabel("MB moved to the final round (training, probes and updates; up + down)")
        axis.set_ylabel("final mean client test accuracy (%)")
        axis.set_title(f"{setting}: accuracy against communication (mean over seeds, bars: ± one std)", fontsize=10)
        axis.grid(alpha=0.3, which="both")
        written.append(save_figure(figure, out_dir / f"communication_{file_part(setting)}.png"))
    return written
