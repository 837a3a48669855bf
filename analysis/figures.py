"""The report's figures (PNG): learning curves, grouping diagnostics over refreshes,
per-client accuracy distributions, the membership heatmap at the last refresh,
accuracy against communication (analysis/communication_figure.py), and accuracy and
grouping against the epsilon of private runs (analysis/privacy_figure.py)."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from analysis.figure_files import file_part, pyplot, save_figure  # noqa: F401  (save_figure re-exported)
from analysis.runs import RunRecord
from hdcfl_ray.diagnostics.curve_trend import rounds_curve, scored_curve


def _curves(runs: list[RunRecord]) -> dict[tuple[str, str], list[tuple[list[int], list[float], list[float]]]]:
    """Per setting and method, each seed's evaluated rounds, its trend curve (one quantity
    throughout: curve_trend.rounds_curve) and its scores as logged, in %."""
    curves: dict[tuple[str, str], list[tuple[list[int], list[float], list[float]]]] = defaultdict(list)
    for run in runs:
        rows = run.rounds.to_pylist()
        trend, scored = rounds_curve(rows), scored_curve(rows)
        if trend:
            curves[(run.setting, run.method)].append(([r for r, _ in trend], [100 * a for _, a in trend], [100 * a for _, a in scored]))
    return curves


def learning_curves(runs: list[RunRecord], out_dir: Path) -> list[Path]:
    """Mean client accuracy over rounds, mean +- one std over seeds, one figure per setting.
    HDC-FL's curve follows the shared encoder before activation and its mixtures after. A
    method that personalises at its final evaluation only (FedBABU) is drawn with its shared
    model's score there, as at every other round, and its personalised score as a marker."""
    plt = pyplot()
    curves = _curves(runs)
    written = []
    for setting in sorted({s for s, _ in curves}):
        figure, axis = plt.subplots(figsize=(7, 4.5))
        drawn = [(method, seeds) for (curve_setting, method), seeds in sorted(curves.items()) if curve_setting == setting]
        for index, (method, seeds) in enumerate(drawn):
            rounds = sorted(set.intersection(*(set(r) for r, _, _ in seeds)))
            stacked = np.array([[dict(zip(r, a))[t] for t in rounds] for r, a, _ in seeds])
            scored = np.array([[dict(zip(r, a))[t] for t in rounds] for r, _, a in seeds])
            mean = stacked.mean(axis=0)
            # past the ten colours of the cycle, dashed: the sixteen built-in methods stay told apart
            style = "-" if index < 10 else "--"
            (line,) = axis.plot(rounds, mean, style, label=f"{method} ({len(seeds)} seed{'s' if len(seeds) > 1 else ''})")
            if len(seeds) > 1:
                spread = stacked.std(axis=0, ddof=1)
                axis.fill_between(rounds, mean - spread, mean + spread, alpha=0.2)
            apart = ~np.isclose(scored, stacked).all(axis=0)
            if apart.any():
                axis.plot(np.array(rounds)[apart], scored.mean(axis=0)[apart], marker="x", linestyle="none", color=line.get_color(),
                          label=f"{method}: personalised at the final evaluation only")  # fmt: skip
        axis.set_xlabel("round (server version in asynchronous runs)")
        axis.set_ylabel("mean client test accuracy (%)")
        axis.set_title(f"{setting}: learning curves (shaded: ± one std over seeds)")
        axis.grid(alpha=0.3)
        if len(drawn) > 6:  # beside the axes, where it hides no curve
            figure.set_size_inches(10, 4.5)
            axis.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
        else:
            axis.legend(fontsize=8)
        written.append(save_figure(figure, out_dir / f"learning_curves_{file_part(setting)}.png"))
    return written


GROUPING_PANELS = (
    ("silhouette", "silhouette"),
    ("ari_previous", "ARI with previous refresh"),
    ("ari_true", "ARI vs planted groups"),
    ("membership_entropy_normalized", "membership entropy / log G"),
    ("personalization_gain", "personalisation gain (pp)"),
)


def grouping_diagnostics(runs: list[RunRecord], out_dir: Path) -> list[Path]:
    """HDC-FL's refresh diagnostics over rounds, one figure per setting, one line per seed."""
    plt = pyplot()
    by_setting: dict[str, list[RunRecord]] = defaultdict(list)
    for run in runs:
        if run.refresh.num_rows:
            by_setting[run.setting].append(run)
    written = []
    for setting, setting_runs in sorted(by_setting.items()):
        figure, axes = plt.subplots(1, len(GROUPING_PANELS), figsize=(4 * len(GROUPING_PANELS), 3.4))
        for axis, (column, title) in zip(axes, GROUPING_PANELS):
            for run in sorted(setting_runs, key=lambda r: (r.algorithm, r.seed)):
                rows = run.refresh.to_pylist()
                points = [(r["round"], r[column]) for r in rows if r[column] is not None and not math.isnan(r[column])]
                if points:
                    xs, ys = zip(*points)
                    axis.plot(xs, ys, marker="o", label=f"{run.algorithm} seed {run.seed}")
            axis.set_title(title, fontsize=10)
            axis.set_xlabel("round")
            axis.grid(alpha=0.3)
        axes[0].legend(fontsize=7)
        figure.suptitle(f"{setting}: grouping diagnostics at each refresh")
        written.append(save_figure(figure, out_dir / f"grouping_{file_part(setting)}.png"))
    return written


def client_distributions(runs: list[RunRecord], out_dir: Path) -> list[Path]:
    """Final-round per-client accuracies per method (all seeds pooled), one figure per setting."""
    plt = pyplot()
    per_setting: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        final = run.final_evaluated_round()
        if final is None:
            continue
        rows = [r for r in run.clients.to_pylist() if r["round"] == final["round"]]
        per_setting[run.setting][run.method].extend(100 * r["accuracy"] for r in rows)
    written = []
    for setting, methods in sorted(per_setting.items()):
        names = sorted(methods)
        figure, axis = plt.subplots(figsize=(max(5, 1.1 * len(names)), 4))
        axis.boxplot([methods[n] for n in names], showmeans=True)
        axis.set_xticks(range(1, len(names) + 1), names, rotation=30, ha="right")
        axis.set_ylabel("client test accuracy (%), final round")
        axis.set_title(f"{setting}: per-client accuracy (seeds pooled; triangle = mean)")
        axis.grid(alpha=0.3, axis="y")
        written.append(save_figure(figure, out_dir / f"clients_{file_part(setting)}.png"))
    return written


def membership_heatmaps(runs: list[RunRecord], out_dir: Path) -> list[Path]:
    """Soft memberships at the last evaluated round for each run that has them
    (clients x groups), clients ordered by planted group when known."""
    plt = pyplot()
    written = []
    for run in runs:
        final = run.final_evaluated_round()
        if final is None:
            continue
        rows = [r for r in run.clients.to_pylist() if r["round"] == final["round"] and r["memberships"]]
        if not rows:
            continue
        rows.sort(key=lambda r: (r["true_group"] if r["true_group"] is not None else -1, r["client_id"]))
        matrix = np.array([r["memberships"] for r in rows])
        figure, axis = plt.subplots(figsize=(1.2 + 0.6 * matrix.shape[1], 1.2 + 0.22 * len(rows)))
        image = axis.imshow(matrix, aspect="auto", cmap="viridis", vmin=0, vmax=1)
        axis.set_yticks(range(len(rows)), [f"{r['client_id']} (g{r['true_group']})" if r["true_group"] is not None else str(r["client_id"]) for r in rows], fontsize=7)
        axis.set_xlabel("group")
        axis.set_title(f"{run.setting} {run.algorithm} seed {run.seed}\nmemberships, round {final['round']}", fontsize=9)
        figure.colorbar(image, ax=axis)
        written.append(save_figure(figure, out_dir / f"memberships_{file_part(run.setting)}_{run.algorithm}_seed{run.seed}.png"))
    return written


def write_figures(runs: list[RunRecord], out_dir: Path) -> list[Path]:
    from analysis.communication_figure import accuracy_against_communication
    from analysis.privacy_figure import metric_against_epsilon

    out_dir.mkdir(parents=True, exist_ok=True)
    return [
        *learning_curves(runs, out_dir),
        *grouping_diagnostics(runs, out_dir),
        *client_distributions(runs, out_dir),
        *membership_heatmaps(runs, out_dir),
        *accuracy_against_communication(runs, out_dir),
        *metric_against_epsilon(runs, out_dir),
    ]
