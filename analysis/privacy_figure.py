"""The report's metric-against-epsilon figure: per setting whose runs hold one method at
two or more privacy levels (analysis/privacy_levels.py), its final mean client accuracy,
worst-client accuracy and ARI against the planted groups against the epsilon the runs
reached (RDP, the guarantee), one line per method, means over seeds with one-std bars
over seeds. The epsilon axis is logarithmic; the runs of the same setting without
privacy stand at its right edge, labelled "no DP", joined by a dashed segment."""

from __future__ import annotations

import math
from typing import Iterable
from pathlib import Path
from statistics import stdev

from analysis.figure_files import file_part, pyplot, save_figure
from analysis.privacy_levels import Level, Line, privacy_lines
from analysis.runs import RunRecord

# (final metric, axis label, scale)
PANELS = (
    ("mean_accuracy", "final mean client test accuracy (%)", 100.0),
    ("worst_accuracy", "final worst-client test accuracy (%)", 100.0),
    ("ari_true", "final ARI against the planted groups", 1.0),
)
MIN_PRIVATE_LEVELS = 2  # a line is drawn from two privacy levels on
NO_DP_LABEL = "no DP"
NO_DP_DECADES = 0.6  # how far right of the largest epsilon the "no DP" column stands (log10 units)
NUDGE_DECADES = 0.012  # how far apart the lines' points at one epsilon stand (log10 units)
MARKERS = ("o", "s", "^", "D", "v", "P")


def drawn_lines(runs: list[RunRecord]) -> dict[str, list[Line]]:
    """setting -> its lines with at least MIN_PRIVATE_LEVELS private levels."""
    by_setting: dict[str, list[Line]] = {}
    for line in privacy_lines(runs):
        if len(line.private_levels) >= MIN_PRIVATE_LEVELS:
            by_setting.setdefault(line.setting, []).append(line)
    return by_setting


def metric_against_epsilon(runs: list[RunRecord], out_dir: Path) -> list[Path]:
    """One figure per setting with a line to draw (drawn_lines): `privacy_<setting>.png`."""
    return [
        epsilon_figure(lines, out_dir / f"privacy_{file_part(setting)}.png", setting)
        for setting, lines in sorted(drawn_lines(runs).items())
    ]


def no_dp_position(lines: list[Line]) -> float:
    """Where "no DP" stands on the epsilon axis: NO_DP_DECADES right of the largest epsilon reached."""
    largest = max(level.epsilon for line in lines for level in line.private_levels if math.isfinite(level.epsilon))
    return largest * 10**NO_DP_DECADES


def epsilon_figure(lines: list[Line], path: Path, title: str) -> Path:
    """Draw `lines` (one setting's) into `path`, the panels of PANELS that any line has values for."""
    from matplotlib.ticker import FixedLocator, NullLocator

    plt = pyplot()
    colours = plt.get_cmap("tab10")
    panels = [panel for panel in PANELS if any(_has(line, panel[0]) for line in lines)]
    figure, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.2), squeeze=False)
    no_dp_x = no_dp_position(lines)
    with_no_dp = any(line.no_dp is not None for line in lines)
    for axis, (metric, label, scale) in zip(axes[0], panels):
        for index, line in enumerate(lines):
            if not _has(line, metric):
                continue
            colour, marker = colours(index % 10), MARKERS[index // 10 % len(MARKERS)]
            nudge = 10 ** (NUDGE_DECADES * (index - (len(lines) - 1) / 2))  # lines side by side, so their bars do not hide each other
            placed = [(level.private, (nudge * (level.epsilon if level.private else no_dp_x), *_mean_and_spread(level, metric, scale)))
                      for level in line.levels]  # fmt: skip
            placed = [(private, point) for private, point in placed if not math.isnan(point[0]) and not math.isnan(point[1])]
            points = [point for _, point in placed]
            private = [point for is_private, point in placed if is_private]
            axis.errorbar([x for x, _, _ in points], [y for _, y, _ in points], yerr=[s for _, _, s in points],
                          fmt=marker, capsize=3, color=colour, label=line.method)  # fmt: skip
            axis.plot([x for x, _, _ in private], [y for _, y, _ in private], "-", color=colour, linewidth=1.2)
            if len(points) > len(private) and private:
                axis.plot([private[-1][0], points[-1][0]], [private[-1][1], points[-1][1]], "--", color=colour, linewidth=1)
        axis.set_xscale("log")
        epsilons = _tick_values(level.epsilon for line in lines for level in line.private_levels)
        ticks = epsilons + ([no_dp_x] if with_no_dp else [])
        axis.xaxis.set_major_locator(FixedLocator(ticks))
        axis.xaxis.set_minor_locator(NullLocator())
        axis.set_xticklabels([f"{value:.3g}" for value in epsilons] + ([NO_DP_LABEL] if with_no_dp else []))
        if with_no_dp:  # the axis is broken between the largest epsilon and "no DP"
            axis.axvline(max(epsilons) * 10 ** (NO_DP_DECADES / 2), color="grey", linestyle=":", linewidth=1)
        axis.set_xlabel("epsilon reached (RDP)")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    figure.suptitle(f"{title}: {_privacy_caption(lines)}\nmean over seeds, bars: ± one std", fontsize=10)
    return save_figure(figure, path)


def _has(line: Line, metric: str) -> bool:
    return any(not math.isnan(run.values[metric]) for level in line.levels for run in level.runs)


def _mean_and_spread(level: Level, metric: str, scale: float) -> tuple[float, float]:
    values = [scale * run.values[metric] for run in level.runs if not math.isnan(run.values[metric])]
    if not values:
        return math.nan, 0.0
    return sum(values) / len(values), stdev(values) if len(values) > 1 else 0.0


def _privacy_caption(lines: list[Line]) -> str:
    """What every private run of the figure shares: the clip, delta and noise cohort (else 'per line')."""
    parts = []
    for key, shown in (("privacy.clip", "clip C = {}"), ("privacy.delta", "delta = {}"), ("privacy.noise_cohort_size", "noise cohort {}")):
        values = {str(line.privacy.get(key)) for line in lines}
        if len(values) == 1:
            value = values.pop()
            parts.append(shown.format("as simulated" if value == "None" else value))
        else:
            parts.append(shown.format("per line"))
    return "metrics against epsilon (" + ", ".join(parts) + ")"


def _tick_values(values: Iterable[float]) -> list[float]:
    """The epsilons to mark on the axis: one tick for values within 10% of each other (the
    methods of one level reach it to within the accountant's tolerance: 1.99 and 2 would
    print over each other), at the largest of them."""
    ticks: list[float] = []
    for value in sorted({round(float(v), 2) for v in values}):
        if ticks and value <= ticks[-1] * 1.1:
            ticks[-1] = value
        else:
            ticks.append(value)
    return ticks
