"""A study: how far the `auto` rule's choice lands from the best value of its grid, on
settings no grid was designed on.

For each setting (digits split by label subsets of k = 2 classes, and by Dirichlet(0.1)
class shares; 20 clients, 20 rounds, the quickstart's model and training), each seed
(61, 62, 63: no test and no grid ever used them) and each method with data-dependent
knobs, it runs

  fixed   every value of the knob's grid (and the one step beyond its edge that a choice
          may extend to), the whole run, scored on the test images: after the fact, the
          best value the grid held;
  choice  the `auto` choice itself, as a run makes it (shortened candidate runs scored on
          images held out of each client's training data, never the test set);

and reports, per setting, method and seed, the value chosen, its test accuracy (the fixed
run with that value: the same scenario and seed, so the same bits), the best fixed value
and its accuracy, the regret (best minus chosen) and the seed spread (the sample std over
the seeds of the best fixed accuracy), with the verdict "within the seed spread" when the
regret is at most that spread. The report then measures, from the same runs, what the
criterion asks (a choice made on the test set one evaluated round before the end, scored
the same way) and how each client's held-out images weigh its rare classes against its
test images, and judges `auto` as a method by the project's paired verdict rule
(analysis/verdict.py) against the one fixed value with the best mean over the seeds, at
the last round and over the last three.

    python studies/auto_knob_regret.py [--out runs/auto-regret] [--methods pacfl,ifca,...] [--seeds 61,62,63]
        [--part fixed|choice|report|all] [--settings digits-ls2,digits-dir0.1] [--report docs/auto-knob-regret-tables.md]
        [--round-share 1 --only SETTING:METHOD:SEED,...]   # the full-schedule probe
        [--finalist-draws 5 --only SETTING:METHOD:SEED,...]  # the more-draws probe
        [--seeds 61,62,63,64,65,66,67]  # docs/auto-knob-regret-tables-7-seeds.md: four more seeds (64 to 67 run as 61-63)

The probe's out folder links the fixed runs (`ln -s ../auto-regret/fixed runs/auto-regret-full/fixed`)
and makes only the choices named.

Every run is resumable: a finished run folder is reused, so the study can be stopped and
started again. Runs are in the portable mode (the same bits on every x86-64 machine).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BASE = REPO / "scenarios/auto/digits-ls3.yaml"
SETTINGS: dict[str, dict[str, Any]] = {
    "digits-ls2": {"partition.kind": "label_subset", "partition.k": 2},
    "digits-dir0.1": {"partition.kind": "dirichlet", "partition.alpha": 0.1},
}
SEEDS = (61, 62, 63)
METHODS = ("pacfl", "ifca", "fedprox", "fedce", "fedsoft", "hdcfl")
# the reference every clustered method is read against (no knob: one fixed run per seed)
REFERENCE = "local"


def grids(method: str, num_clients: int) -> dict[str, tuple[Any, ...]]:
    """Each auto knob of `method` and the values the study runs: the knob's grid and the
    step beyond its edge a choice may extend to (the method's own declaration)."""
    from hdcfl_ray.algorithms.registry import method_spec
    from hdcfl_ray.config.loading import build_scenario
    from hdcfl_ray.config.schema import method_params

    import yaml

    raw = yaml.safe_load(BASE.read_text())
    raw["algorithm"]["name"] = method
    params = method_params(build_scenario(raw).algorithm)
    found: dict[str, tuple[Any, ...]] = {}
    for knob in method_spec(method).auto_knobs:
        values = list(knob.candidates(params))
        beyond = getattr(knob, "beyond", None)
        if beyond is not None:
            for edge in ("high", "low"):
                extra = beyond(params, values[-1] if edge == "high" else values[0], edge, num_clients)
                if extra is not None and extra not in values:
                    values = [*values, extra] if edge == "high" else [extra, *values]
        if knob.counts_models:
            values = [value for value in values if value <= num_clients]
        found[knob.key] = tuple(values)
    return found


def overrides(setting: str, method: str, seed: int, values: dict[str, Any], out: Path) -> dict[str, Any]:
    keys = {"name": setting, "seed": seed, "algorithm.name": method, "output.dir": str(out), **SETTINGS[setting]}
    keys.update({f"algorithm.{method}.{key}": value for key, value in values.items()})
    return keys


def finished(run_dir: Path) -> bool:
    manifest = run_dir / "manifest.json"
    return manifest.is_file() and json.loads(manifest.read_text()).get("status") == "completed"


@functools.cache
def test_accuracy_by_round(run_dir: Path) -> list[float]:
    """The run's mean client test accuracy at each evaluated round, in round order (read
    once per process: the report's tables all read the same finished runs; callers do not
    change the list)."""
    import pyarrow.parquet as pq

    rows = sorted((row for row in pq.read_table(run_dir / "rounds.parquet").to_pylist() if row["evaluated"]), key=lambda row: row["round"])
    return [float(row["mean_accuracy"]) for row in rows]


def final_test_accuracy(run_dir: Path) -> float:
    return test_accuracy_by_round(run_dir)[-1]


def value_name(values: dict[str, Any]) -> str:
    return "-".join(f"{key}{value:g}" for key, value in sorted(values.items())) or "fixed"


def run_fixed(out: Path, methods: list[str], seeds: list[int]) -> None:
    import hdcfl_ray

    todo = []
    for setting, method, seed in itertools.product(SETTINGS, [*methods, REFERENCE], seeds):
        knobs = grids(method, 20)
        for combination in itertools.product(*knobs.values()):
            values = dict(zip(knobs, combination))
            todo.append((setting, method, seed, values, out / "fixed" / setting / method / value_name(values) / f"seed{seed}"))
    started, done = time.perf_counter(), 0
    for position, (setting, method, seed, values, run_dir) in enumerate(todo, start=1):
        if finished(run_dir):
            continue
        if run_dir.exists():  # killed part-way: start it again
            import shutil

            shutil.rmtree(run_dir)
        hdcfl_ray.simulate(BASE, overrides=overrides(setting, method, seed, values, out), out=run_dir, progress=False)
        done += 1
        rate = (time.perf_counter() - started) / done
        print(f"[fixed {position}/{len(todo)}] {setting} {method} {value_name(values)} seed {seed}: "
              f"{100 * final_test_accuracy(run_dir):.2f}% (about {rate * (len(todo) - position) / 60:.0f} min left)", flush=True)


def run_choices(
    out: Path,
    settings: list[str],
    methods: list[str],
    seeds: list[int],
    only: set[tuple[str, str, int]] | None = None,
    finalist_draws: int | None = None,
) -> None:
    """The auto choice of each setting, method and seed, as a run makes it (its candidates
    and its record land in out/choice/); with `only`, just those (setting, method, seed).
    Two processes given other `settings` share the work. `finalist_draws`: each
    finalist runs on this many held-out draws instead of the rule's own (a probe)."""
    from types import SimpleNamespace

    from hdcfl_ray.api import resolve_scenario
    from hdcfl_ray.runtime.driver import prepare_run, with_auto_choices

    for setting, method, seed in itertools.product(settings, methods, seeds):
        record_path = out / "choice" / setting / method / f"seed{seed}.json"
        if record_path.is_file() or (only is not None and (setting, method, seed) not in only):
            continue
        knobs = {f"algorithm.{method}.{key}": "auto" for key in grids(method, 20)}
        scenario = resolve_scenario(BASE, {**overrides(setting, method, seed, {}, out), **knobs})
        prepared = prepare_run(scenario)
        assert prepared.auto_plan is not None, f"{method} has no auto knob"
        if finalist_draws is not None:
            import dataclasses

            prepared = dataclasses.replace(prepared, auto_plan=dataclasses.replace(prepared.auto_plan, draws=finalist_draws))
        started = time.perf_counter()
        # the run's own choosing (its candidates, probes and cache), with its notes printed
        observer = SimpleNamespace(on_notice=lambda text: print(f"  {text}", flush=True))
        record = with_auto_choices(prepared, out / "choice" / setting / method, observer, None, out / "choice" / "cache").auto_knobs  # type: ignore[arg-type]
        assert record is not None
        record_path.parent.mkdir(parents=True, exist_ok=True)
        record_path.write_text(json.dumps({"record": record.as_dict(), "seconds": time.perf_counter() - started}, indent=1, default=str))
        print(f"[choice] {setting} {method} seed {seed}: {record.choices()} in {time.perf_counter() - started:.0f} s", flush=True)


def report(out: Path, methods: list[str], seeds: list[int]) -> str:
    lines = [
        "| setting | method | seed | chosen | test acc. of the choice | best fixed value | its test acc. | regret (pp) | seed spread (pp) | verdict | Local's test acc. |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    summary: list[tuple[str, str, float, float]] = []
    seconds: dict[str, list[float]] = {}
    for setting, method in itertools.product(SETTINGS, methods):
        curves = fixed_curves(out, setting, method, seeds)
        best_per_seed, spread = best_final_values(curves)
        for seed in seeds:
            record_path = out / "choice" / setting / method / f"seed{seed}.json"
            if seed not in best_per_seed or not record_path.is_file():
                continue
            document = json.loads(record_path.read_text())
            seconds.setdefault(method, []).append(float(document["seconds"]))
            chosen = chosen_values(document["record"])
            chosen_accuracy = curves[seed].get(value_name(chosen), [math.nan])[-1]
            best_name, (*_, best_accuracy) = best_per_seed[seed]
            regret = 100 * (best_accuracy - chosen_accuracy)
            verdict = "within the seed spread" if regret <= 100 * spread + 1e-9 else "outside the seed spread"
            summary.append((setting, method, regret, 100 * spread))
            local_accuracy = local_curve(out, setting, seed)
            local = f"{100 * local_accuracy[-1]:.2f}" if local_accuracy else "-"
            lines.append(
                f"| {setting} | {method} | {seed} | {value_name(chosen)} | {100 * chosen_accuracy:.2f} | {best_name} | "
                f"{100 * best_accuracy:.2f} | {regret:.2f} | {100 * spread:.2f} | {verdict} | {local} |"
            )
    worst = max(summary, key=lambda row: row[2] - row[3]) if summary else None
    tail = ""
    if worst is not None:
        tail = f"\nLargest regret over its seed spread: {worst[1]} on {worst[0]}, {worst[2]:.2f} pp against {worst[3]:.2f} pp.\n"
    return _summary(summary, seconds) + "\n" + "\n".join(lines) + "\n" + tail


def chosen_values(record: dict[str, Any]) -> dict[str, Any]:
    """The values a choice's record chose, by knob field."""
    return {knob["key"].rsplit(".", 1)[1]: knob["chosen"] for knob in record["knobs"]}


def paired_against_best(out: Path, methods: list[str], seeds: list[int], last_rounds: int) -> str:
    """The project's verdict rule (analysis/verdict.py) applied to the rule itself: per
    setting and method, `auto` against the single fixed value with the best mean test
    accuracy over the seeds (found after the fact), paired seed by seed. A run's accuracy
    is its mean client test accuracy averaged over its last `last_rounds` evaluated rounds."""
    from analysis.verdict import paired_verdict

    if len(seeds) < 2:
        return "One seed: no verdict.\n"
    lines = [
        f"| setting | method | auto's choices ({' / '.join(map(str, seeds))}) | auto: mean ± std | best fixed value | its mean ± std | auto minus it, per seed (pp) | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    verdicts: list[str] = []
    for setting, method in itertools.product(SETTINGS, methods):
        curves = fixed_curves(out, setting, method, seeds)
        documents = {seed: out / "choice" / setting / method / f"seed{seed}.json" for seed in seeds}
        if set(curves) != set(seeds) or not all(path.is_file() for path in documents.values()):
            continue
        scores = {seed: {name: statistics.mean(curve[-last_rounds:]) for name, curve in values.items()} for seed, values in curves.items()}
        shared = set.intersection(*(set(values) for values in scores.values()))
        best = max(sorted(shared), key=lambda name: statistics.mean(scores[seed][name] for seed in seeds))
        chosen = {seed: value_name(chosen_values(json.loads(documents[seed].read_text())["record"])) for seed in seeds}
        same_as_local = {seed for seed in seeds if curves[seed][chosen[seed]] == local_curve(out, setting, seed)}
        auto = [100 * scores[seed][chosen[seed]] for seed in seeds]
        fixed = [100 * scores[seed][best] for seed in seeds]
        differences = [a - b for a, b in zip(auto, fixed)]
        verdict = paired_verdict(differences)
        verdicts.append(verdict)
        lines.append(
            f"| {setting} | {method} | {' / '.join(chosen[seed] + (' (Local)' if seed in same_as_local else '') for seed in seeds)} | {statistics.mean(auto):.2f} ± {statistics.stdev(auto):.2f} | "
            f"{best} | {statistics.mean(fixed):.2f} ± {statistics.stdev(fixed):.2f} | {', '.join(f'{d:+.2f}' for d in differences)} | {verdict} |"
        )
    counts = ", ".join(f"{verdicts.count(word)} {word}" for word in dict.fromkeys(verdicts))
    lines.append("")
    lines.append(f"Of {len(verdicts)} settings and methods, auto against the best fixed value: {counts}. "
                 "(Local): the chosen run is Local's, bit for bit (one cluster per client).")
    return "\n".join(lines) + "\n"


def local_curve(out: Path, setting: str, seed: int) -> list[float] | None:
    """The reference Local run's test accuracy by round at `seed`, if it finished."""
    run_dir = out / "fixed" / setting / REFERENCE / "fixed" / f"seed{seed}"
    return test_accuracy_by_round(run_dir) if finished(run_dir) else None


def fixed_curves(out: Path, setting: str, method: str, seeds: list[int]) -> dict[int, dict[str, list[float]]]:
    """Per seed, each finished fixed value's test accuracy by round."""
    knobs = grids(method, 20)
    curves: dict[int, dict[str, list[float]]] = {}
    for combination in itertools.product(*knobs.values()):
        name = value_name(dict(zip(knobs, combination)))
        for seed in seeds:
            run_dir = out / "fixed" / setting / method / name / f"seed{seed}"
            if finished(run_dir):
                curves.setdefault(seed, {})[name] = test_accuracy_by_round(run_dir)
    return curves


def best_final_values(curves: dict[int, dict[str, list[float]]]) -> tuple[dict[int, tuple[str, list[float]]], float]:
    """Per seed, the fixed value with the best final test accuracy (name, curve), and the
    seed spread: the sample std over the seeds of that best final accuracy (NaN with one seed)."""
    best = {seed: max(values.items(), key=lambda item: item[1][-1]) for seed, values in curves.items() if values}
    spread = statistics.stdev(curve[-1] for _, curve in best.values()) if len(best) > 1 else math.nan
    return best, spread


def oracle_floor(out: Path, methods: list[str], seeds: list[int]) -> str:
    """What the criterion asks of any rule: a choice made on the test set itself, one
    evaluated round before the end (the value best on test there), scored like the
    choices (its regret at the end against the seed spread of the best final value)."""
    lines = [
        "| setting | method | seed | best on test one round before the end | its final test acc. | best final value | its test acc. | regret (pp) | seed spread (pp) | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    outside, total = 0, 0
    for setting, method in itertools.product(SETTINGS, methods):
        curves = fixed_curves(out, setting, method, seeds)
        best_final, spread = best_final_values(curves)
        if len(best_final) < 2:
            continue
        spread *= 100
        for seed, values in curves.items():
            early, early_curve = max(values.items(), key=lambda item: item[1][-2] if len(item[1]) > 1 else -1.0)
            best_name, best_curve = best_final[seed]
            regret = 100 * (best_curve[-1] - early_curve[-1])
            inside = regret <= spread + 1e-9
            outside += not inside
            total += 1
            lines.append(
                f"| {setting} | {method} | {seed} | {early} | {100 * early_curve[-1]:.2f} | {best_name} | {100 * best_curve[-1]:.2f} | "
                f"{regret:.2f} | {spread:.2f} | {'within the seed spread' if inside else 'outside the seed spread'} |"
            )
    lines.append("")
    lines.append(f"{total - outside} of {total} test-set choices one round early within the seed spread.")
    return "\n".join(lines) + "\n"


def validation_composition(seeds: list[int], minority_share: float = 0.1) -> str:
    """How each client's held-out images and its test images weigh its minority classes
    (those holding at most `minority_share` of its training images), per setting and seed:
    the mean over clients of the share of its scored images from those classes."""
    import numpy as np

    from hdcfl_ray.api import resolve_scenario
    from hdcfl_ray.data.partitions.build import partition_dataset
    from hdcfl_ray.data.sources import load_dataset

    lines = [
        f"| setting | seed | clients' held-out images from classes of at most {minority_share:.0%} of their training images | their test images from those classes |",
        "|---|---|---|---|",
    ]
    for setting, seed in itertools.product(SETTINGS, seeds):
        scenario = resolve_scenario(BASE, {"seed": seed, **SETTINGS[setting]})
        dataset = load_dataset(scenario.dataset, scenario.seed)
        labels = {"train": dataset.train_labels, "test": dataset.test_labels}
        config = scenario.partition
        held_out = partition_dataset(config.model_copy(update={"validation_fraction": 0.2}), dataset, seed)
        tested = partition_dataset(config, dataset, seed)
        num_classes = dataset.num_classes
        shares: list[tuple[float, float]] = []
        for validation_client, test_client in zip(held_out.clients, tested.clients):
            train = np.bincount(labels["train"][test_client.train_indices], minlength=num_classes)
            minority = (train > 0) & (train <= minority_share * train.sum())
            scored_validation = np.bincount(labels["train"][validation_client.test_indices], minlength=num_classes)
            scored_test = np.bincount(labels["test"][test_client.test_indices], minlength=num_classes)
            shares.append((scored_validation[minority].sum() / scored_validation.sum(), scored_test[minority].sum() / scored_test.sum()))
        lines.append(f"| {setting} | {seed} | {100 * np.mean([a for a, _ in shares]):.1f}% | {100 * np.mean([b for _, b in shares]):.1f}% |")
    return "\n".join(lines) + "\n"


def _summary(rows: list[tuple[str, str, float, float]], seconds: dict[str, list[float]]) -> str:
    """Per method: the choices outside the seed spread, the mean and largest regret, and
    the median time a choice took; and the whole study's line."""
    if not rows:
        return ""
    lines = [
        "| method | choices outside the seed spread | mean regret (pp) | largest regret (pp) | median time of a choice (s) |",
        "|---|---|---|---|---|",
    ]
    for method in dict.fromkeys(row[1] for row in rows):
        mine = [row for row in rows if row[1] == method]
        outside = sum(1 for row in mine if row[2] > row[3] + 1e-9)
        regrets = [row[2] for row in mine]
        lines.append(
            f"| {method} | {outside} of {len(mine)} | {statistics.mean(regrets):.2f} | {max(regrets):.2f} | "
            f"{statistics.median(seconds[method]):.0f} |"
        )
    outside = sum(1 for row in rows if row[2] > row[3] + 1e-9)
    regrets = [row[2] for row in rows]
    lines.append("")
    lines.append(
        f"{len(rows) - outside} of {len(rows)} choices within the seed spread; mean regret {statistics.mean(regrets):.2f} pp "
        f"(median {statistics.median(regrets):.2f} pp)."
    )
    return "\n".join(lines) + "\n"


def _pin_this_process() -> None:
    """The study's runs are portable: this process restarts itself pinned, once."""
    from hdcfl_ray.portable.environment import portable_environment
    from hdcfl_ray.portable.process import require_pinned_process, unpinned_libraries
    from hdcfl_ray.portable.restart import RESTARTED

    if not unpinned_libraries():
        return
    if RESTARTED in os.environ:
        require_pinned_process("the study")
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **portable_environment(), RESTARTED: "{}"})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "runs/auto-regret")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    parser.add_argument("--part", choices=["fixed", "choice", "report", "all"], default="all")
    parser.add_argument("--report", type=Path, default=None, help="write the table here too")
    parser.add_argument("--round-share", type=float, default=None,
                        help="candidates run this share of the run's rounds (the rule's own is 0.4; 1 = the whole schedule)")
    parser.add_argument("--finalist-draws", type=int, default=None,
                        help="each finalist runs on this many held-out draws (the rule's own is 2)")
    parser.add_argument("--settings", default=",".join(SETTINGS), help="the settings whose choices this process makes")
    parser.add_argument("--only", default=None, help="choices to make, e.g. digits-ls2:fedce:61,digits-dir0.1:pacfl:62")
    args = parser.parse_args()
    methods = [name for name in args.methods.split(",") if name]
    seeds = [int(seed) for seed in args.seeds.split(",")]
    settings = [name for name in args.settings.split(",") if name]
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        parser.error(f"--settings: {', '.join(unknown)} not among {', '.join(SETTINGS)}")
    if args.part != "report":
        _pin_this_process()
    if args.part in ("fixed", "all"):
        run_fixed(args.out, methods, seeds)
    if args.round_share is not None:
        import hdcfl_ray.auto_knobs.plan as plan

        plan.ROUNDS_SHARE = args.round_share
    only = None
    if args.only:
        only = {(setting, method, int(seed)) for setting, method, seed in (case.split(":") for case in args.only.split(","))}
    if args.part in ("choice", "all"):
        run_choices(args.out, settings, methods, seeds, only, args.finalist_draws)
    table = report(args.out, methods, seeds)
    table += "\n## What the criterion asks: a choice made on the test set one round early\n\n" + oracle_floor(args.out, methods, seeds)
    for last_rounds in (1, 3):
        table += (f"\n## By the project's verdict rule, accuracy {'at the last round' if last_rounds == 1 else f'averaged over the last {last_rounds} rounds'}\n\n"
                  + paired_against_best(args.out, methods, seeds, last_rounds))
    table += "\n## What the held-out images weigh\n\n" + validation_composition(seeds)
    print(table)
    if args.report is not None:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        command = " ".join(["python studies/auto_knob_regret.py", *(arg if " " not in arg else repr(arg) for arg in sys.argv[1:])])
        header = f"# The `auto` rule's regret study: its tables\n\nWritten by `{command}`; docs/auto-knob-regret.md reads them.\n\n"
        args.report.write_text(header + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
