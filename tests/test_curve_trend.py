"""The report's "still rising" flag: a table made while a method's curve still climbs says
so on its row (hdcfl_ray/diagnostics/curve_trend.py), from curves shaped like the runs that needed it."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hdcfl_ray.diagnostics.curve_trend import FALLING_MIN_POINTS, RISING_MIN_POINTS, CurveRises, curve_rises, still_falling, still_rising
from analysis.final_metrics import RunMetrics
from analysis.report_tables import all_tables, to_markdown
from analysis.row_flags import row_flags

# mean accuracy by evaluated round of the Shakespeare stand-in's FedAvg (seed 42), every 5 rounds
STANDIN_FEDAVG = [21.3, 29.5, 34.3, 38.0, 42.7, 45.6, 47.6, 50.1, 52.3, 54.6, 54.8, 56.1, 58.0, 58.6, 58.5, 58.1, 59.6, 59.6, 59.4, 59.7]


def curve(values: list[float], every: int = 5) -> list[tuple[int, float]]:
    return [(every * (i + 1), v / 100) for i, v in enumerate(values)]


def rises(values: list[float], every: int = 5) -> tuple[float, float, float]:
    return curve_rises(curve(values, every))


def rising(values: list[float], every: int = 5) -> bool:
    return still_rising(*([value] for value in rises(values, every)))


def test_a_curve_stopped_while_climbing_is_rising_and_the_same_curve_run_on_is_flat():
    late, total, error = rises(STANDIN_FEDAVG[:4])  # stopped at round 20: two points in the last third, no scatter
    assert rising(STANDIN_FEDAVG[:4]) and late == pytest.approx(0.0493, abs=0.0005) and error == 0.0
    late, total, _ = rises(STANDIN_FEDAVG)  # run on to round 100: creeps up by about a point
    assert not rising(STANDIN_FEDAVG) and total == pytest.approx(0.384)


def test_a_small_steady_climb_is_rising_and_noise_on_a_plateau_is_not():
    steady = [13.4, 14.1, 15.4, 16.5, 17.9, 18.5]  # 5 points gained, still gaining 2 a third
    assert rising(steady)
    plateau = [10.0, 40.0, 60.0, 70.0, 71.0, 70.4, 71.2, 70.8, 71.1]
    assert not rising(plateau)


def test_a_curve_wandering_about_chance_or_a_plateau_is_not_a_trend() -> None:
    # a private run at chance: +3.2 pp fitted over its last third, inside its own scatter
    at_chance = [10.0, 11.0, 9.5, 10.2, 8.9, 11.5, 9.0, 12.0, 8.8, 10.5, 9.2, 8.0, 12.0, 7.0, 13.0, 9.0, 14.0, 11.0]
    late, total, error = rises(at_chance, every=5)
    assert late > RISING_MIN_POINTS and late < 2 * error and not rising(at_chance)
    # the same rise with little scatter is one
    steady = [10.0 + 0.05 * i for i in range(18)] + [11.0 + 0.2 * i for i in range(9)]
    assert rising(steady)


def test_a_falling_or_too_short_curve_is_never_rising():
    assert not rising([50.0, 60.0, 55.0, 45.0, 40.0])
    assert all(math.isnan(v) for v in rises([10.0, 30.0]))
    assert not still_rising([math.nan], [math.nan])


def test_the_rule_is_on_the_mean_over_seeds():
    climbing, flat = rises(STANDIN_FEDAVG[:4]), rises(STANDIN_FEDAVG)
    assert still_rising([climbing.late, climbing.late, flat.late], [climbing.total, climbing.total, flat.total])
    assert not still_rising([flat.late, flat.late, climbing.late / 4], [flat.total, flat.total, climbing.total])


@given(st.lists(st.floats(0.0, 1.0), min_size=3, max_size=40), st.floats(-0.3, 0.3), st.integers(1, 5))
def test_adding_a_constant_or_spacing_the_evaluations_otherwise_changes_no_verdict(values, offset, every):
    points = [(every * (i + 1), v) for i, v in enumerate(values)]
    shifted = [(r, v + offset) for r, v in points]
    assert still_rising(*([v] for v in curve_rises(points))) == still_rising(*([v] for v in curve_rises(shifted)))


def test_a_late_rise_at_the_floor_is_flat():
    assert not still_rising([RISING_MIN_POINTS], [0.0]) and still_rising([RISING_MIN_POINTS * 1.01], [0.0])


def record(method: str, seed: int, values: list[float]) -> RunMetrics:
    late, total, error = rises(values)
    final = values[-1] / 100
    metrics = {"mean_accuracy": final, "worst_accuracy": final - 0.1, "bottom20_accuracy": final - 0.05, "gap": 0.2,
               "ari_true": math.nan, "num_groups": math.nan, "late_rise": late, "total_rise": total, "late_rise_error": error}  # fmt: skip
    return RunMetrics("shakespeare", method, seed, metrics)


def test_the_flag_marks_every_cell_of_a_rising_row_and_its_rule_is_in_the_note():
    runs = [record("fedavg", seed, STANDIN_FEDAVG[:4]) for seed in (1, 2, 3)] + [
        record("local", seed, [40.0, 42.0, 42.5, 42.4]) for seed in (1, 2, 3)
    ]
    flags = row_flags(runs)
    # the stand-in's own story: stopped at round 20, FedAvg is below Local and still climbing
    assert flags[("shakespeare", "fedavg")] == ["below Local", "still rising (+4.9 pp in the last third)"]
    assert ("shakespeare", "local") not in flags
    text = to_markdown(all_tables(runs))
    assert text.count("still rising (+4.9 pp in the last third)") >= 4  # mean, worst, bottom-20%, gap
    assert "[still rising] over the last third of the rounds" in text and "run more rounds" in text


def test_a_run_summary_holds_the_rises_the_report_computes(tmp_path) -> None:
    import random

    from analysis.final_metrics import run_metrics
    from analysis.runs import load_runs
    from hdcfl_ray.config.loading import build_scenario
    from hdcfl_ray.runtime.driver import prepare_run, run_simulation
    from hdcfl_ray.terminal.live_view import QuietObserver
    from tests.conftest import tiny_scenario

    seed = random.randrange(10_000)  # any run: the run and the report read one curve
    scenario = tiny_scenario(seed=seed, algorithm={"name": "fedavg"}, protocol={"rounds": 4}, runtime={"backend": "local"})
    summary = run_simulation(prepare_run(build_scenario(scenario)), tmp_path / "run", QuietObserver())
    (record,) = run_metrics(load_runs([tmp_path]))
    assert not math.isnan(summary.curve.late), seed
    recorded = (record.values["late_rise"], record.values["total_rise"], record.values["late_rise_error"])
    assert recorded == tuple(summary.curve), seed
    evaluated = [(int(row["round"]), row["mean_accuracy"]) for row in load_runs([tmp_path])[0].rounds.to_pylist() if row["evaluated"]]
    best = max(accuracy for _, accuracy in evaluated)  # the report's peak is the run's own best evaluated round
    assert (record.values["peak_accuracy"], record.values["peak_round"]) == (best, min(r for r, a in evaluated if a == best)), seed
    import hdcfl_ray

    run = hdcfl_ray.load_run(tmp_path / "run")  # the Python API reads the same curve
    assert tuple(run.curve) == recorded and run.still_rising == still_rising(*([v] for v in recorded))


@pytest.mark.parametrize(("late", "total", "said"), [(0.178, 0.72, True), (0.008, 0.80, False), (math.nan, math.nan, False)])
def test_the_end_of_a_run_says_when_its_curve_was_still_rising(tmp_path, late, total, said) -> None:
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from hdcfl_ray.terminal.live_view import LiveView

    console = Console(file=io.StringIO(), width=400)
    final = {"round": 30, "mean_accuracy": 0.78, "worst_accuracy": 0.7, "bottom20_accuracy": 0.72, "gap": 0.2, "personalized": False}
    summary = SimpleNamespace(final_round=final, last_refresh=None, scored_on="test", run_dir=tmp_path, elapsed_s=1.0, rounds=30,
                              curve=CurveRises(late, total, 0.0))  # fmt: skip
    LiveView(console).on_finish(summary)
    text = console.file.getvalue()
    assert ("still rising when the run stopped: +17.8 pp over the last third of the rounds" in text) == said
    assert ("protocol.rounds" in text) == said


@pytest.mark.parametrize(("late", "said"), [(0.178, True), (0.008, False)])
def test_a_sweep_names_the_run_whose_curve_was_still_rising(late, said) -> None:
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from hdcfl_ray.terminal.sweep_view import SweepView

    console = Console(file=io.StringIO(), width=400)
    view = SweepView([("quickstart/fedavg/seed42", 30)], console=console)
    view.observer("quickstart/fedavg/seed42").on_finish(SimpleNamespace(curve=CurveRises(late, 0.72, 0.0)))
    text = console.file.getvalue()
    assert ("quickstart/fedavg/seed42: the mean accuracy was still rising when the run stopped: +17.8 pp" in text) == said


# ---- falling: a curve past its best when the run stopped ----------------------------------------

# mean accuracy by evaluated round of APFL on the Shakespeare stand-in at 90 rounds (seed 42), every 5
# rounds (a 90-round run of the stand-in sweep, 2026-12-07): the personalised mixture peaks at round 55 and loses 4.6 points by round 90,
# -2.9 pp fitted over the last third
STANDIN_APFL = [19.2, 29.9, 37.4, 41.7, 45.3, 49.9, 52.3, 53.1, 53.3, 53.4, 53.5, 52.5, 51.5, 50.9, 51.4, 51.4, 49.8, 48.9]


def falling(values: list[float], every: int = 5) -> bool:
    late, _, error = rises(values, every)
    return still_falling([late], [error])


def test_a_curve_past_its_best_is_falling_and_never_rising():
    assert falling(STANDIN_APFL) and not rising(STANDIN_APFL)
    assert not falling(STANDIN_FEDAVG) and not falling(STANDIN_FEDAVG[:4])
    assert falling([50.0, 60.0, 55.0, 45.0, 40.0])


def test_noise_about_a_plateau_is_not_falling():
    wobble = [10.0, 40.0, 60.0, 70.0, 71.0, 70.4, 71.2, 70.8, 71.1, 70.5, 71.3, 70.2]
    assert not falling(wobble)
    at_chance = [10.0, 11.0, 9.5, 10.2, 8.9, 11.5, 9.0, 12.0, 8.8, 10.5, 9.2, 14.0, 8.0, 12.0, 7.0, 11.0, 6.0, 10.0]
    late, _, error = rises(at_chance)
    assert late < -FALLING_MIN_POINTS and -late < 2 * error and not falling(at_chance)


def test_a_late_fall_at_the_floor_is_flat():
    assert not still_falling([-FALLING_MIN_POINTS]) and still_falling([-FALLING_MIN_POINTS * 1.01])


def test_the_falling_flag_marks_the_row_and_its_rule_is_in_the_note():
    runs = [record("apfl", seed, STANDIN_APFL) for seed in (1, 2, 3)] + [record("fedavg", seed, STANDIN_FEDAVG) for seed in (1, 2, 3)]
    flags = row_flags(runs)
    fell = f"{100 * rises(STANDIN_APFL).late:.1f}"
    assert fell == "-2.9"  # what the run's kept curve gives, to one decimal
    assert [flag for flag in flags[("shakespeare", "apfl")] if flag.startswith("falling")] == [f"falling ({fell} pp in the last third)"]
    assert not any(flag.startswith(("falling", "still rising")) for flag in flags.get(("shakespeare", "fedavg"), []))
    text = to_markdown(all_tables(runs))
    assert f"falling ({fell} pp in the last third)" in text
    assert "[falling] over the last third of the rounds the mean accuracy fell" in text and "look at the curves" in text


def test_the_end_of_a_run_says_when_its_curve_was_falling(tmp_path) -> None:
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from hdcfl_ray.terminal.live_view import LiveView

    console = Console(file=io.StringIO(), width=400)
    final = {"round": 90, "mean_accuracy": 0.49, "worst_accuracy": 0.3, "bottom20_accuracy": 0.35, "gap": 0.3, "personalized": True}
    summary = SimpleNamespace(final_round=final, last_refresh=None, scored_on="test", run_dir=tmp_path, elapsed_s=1.0, rounds=90,
                              curve=curve_rises(curve(STANDIN_APFL)))  # fmt: skip
    LiveView(console).on_finish(summary)
    text = console.file.getvalue()
    assert "falling when the run stopped: -2.9 pp over the last third of the rounds" in text and "still rising" not in text


# FedBABU's evaluated rounds on the Shakespeare stand-in (seed 42, the last third of 120 rounds): its body
# under the fixed head at every evaluation, and at the final one also fine-tuned (personalized)
FEDBABU_SHARED = [25.2, 25.9, 26.5, 27.4, 28.2, 29.0, 29.9, 30.8, 31.5]


def babu_rows(shared: list[float], final_personalised: float) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = [
        {"round": 80 + 5 * i, "evaluated": True, "mean_accuracy": v / 100, "mean_accuracy_global": v / 100, "personalized": False}
        for i, v in enumerate(shared)
    ]
    rows[-1].update(mean_accuracy=final_personalised / 100, personalized=True)
    rows.insert(1, {"round": 81, "evaluated": False, "mean_accuracy": None})
    return rows


def test_a_personalisation_step_at_the_final_evaluation_only_is_not_read_as_learning() -> None:
    import random

    from hdcfl_ray.diagnostics.curve_trend import rounds_curve, scored_curve

    jump = random.uniform(1.0, 15.0)  # whatever the fine-tuning adds at the end
    rows = babu_rows(FEDBABU_SHARED, FEDBABU_SHARED[-1] + jump)
    assert rounds_curve(rows)[-1] == (120, FEDBABU_SHARED[-1] / 100)  # the trend's last point: the body, as every other round
    assert scored_curve(rows)[-1][1] == (FEDBABU_SHARED[-1] + jump) / 100  # the peak reads the scores as they are
    late = curve_rises(rounds_curve(rows)).late
    body = [(80 + 5 * i, v / 100) for i, v in enumerate(FEDBABU_SHARED)]
    assert late == curve_rises(body).late, jump  # the body's rise, whatever the jump


def test_a_method_personalised_at_every_evaluation_keeps_its_scores() -> None:
    from hdcfl_ray.diagnostics.curve_trend import rounds_curve

    rows = babu_rows(FEDBABU_SHARED, FEDBABU_SHARED[-1])
    for row in rows:  # Ditto, HDC-FL: personalised models scored at every round, above the shared one
        if row["evaluated"]:
            row.update(personalized=True, mean_accuracy_global=0.1)
    assert [v for _, v in rounds_curve(rows)] == [v / 100 for v in FEDBABU_SHARED]


def test_the_learning_curve_draws_the_body_and_marks_the_final_fine_tuned_score(tmp_path) -> None:
    from types import SimpleNamespace

    import pyarrow as pa

    from analysis.figures import _curves, learning_curves

    rows = [row for row in babu_rows(FEDBABU_SHARED, 37.8) if row["evaluated"]]
    run = SimpleNamespace(setting="shakespeare", method="fedbabu", rounds=pa.Table.from_pylist(rows))
    ((rounds, trend, scored),) = _curves([run])[("shakespeare", "fedbabu")]
    assert trend[-1] == FEDBABU_SHARED[-1] and scored[-1] == 37.8 and trend[:-1] == scored[:-1]
    (written,) = learning_curves([run], tmp_path)
    assert written.exists() and written.stat().st_size > 0
