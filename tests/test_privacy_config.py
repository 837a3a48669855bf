"""The scenario's privacy section: every bad input stops `validate` and `simulate` with
exit 2 naming the key and the fix (a method that refuses privacy, async mode, sampling
the accountant cannot amplify, both or neither noise key, an unreachable target, a
missing accountant); --set creates the section; the run resolves z, q and the adaptive
split where it is prepared; every privacy.* key is one a rerun compares."""

from __future__ import annotations

import sys

import pytest

from hdcfl_ray.config.loading import build_scenario, load_scenario
from hdcfl_ray.config.safe_keys import comparable, may_differ
from hdcfl_ray.config.setting_changes import setting_changes
from hdcfl_ray.contract import PrivacyRule
from hdcfl_ray.runtime.preflight import prepare_run
from hdcfl_ray.runtime.privacy_plan import round_plan
from tests import dp_test_method
from tests.cli_exit import assert_refused
from tests.conftest import needs_accountant, tiny_scenario


@pytest.fixture
def dp_method(monkeypatch: pytest.MonkeyPatch):
    yield from dp_test_method.loaded(monkeypatch)


def private_scenario(privacy: dict, method: str = dp_test_method.NAME, **sections) -> dict:
    return tiny_scenario(algorithm={"name": method}, privacy=privacy, runtime={"backend": "local", "num_cpus": 1}, **sections)


NOISE = {"noise_multiplier": 1.0}


@pytest.mark.parametrize(
    ("privacy", "sections", "expected"),
    [
        ({"noise_multiplier": 1.0, "target_epsilon": 4}, {}, ["privacy.noise_multiplier and privacy.target_epsilon", "both are given"]),
        ({"clip": 2.0}, {}, ["privacy.noise_multiplier and privacy.target_epsilon", "neither is given"]),
        ({"noise_multiplier": 0}, {}, ["privacy.noise_multiplier", "greater than 0"]),
        ({"target_epsilon": -1}, {}, ["privacy.target_epsilon", "greater than 0"]),
        ({**NOISE, "delta": 1.0}, {}, ["privacy.delta", "less than 1"]),
        ({**NOISE, "clip": 0}, {}, ["privacy.clip", "greater than 0"]),
        ({**NOISE, "sampling": "uniform"}, {}, ["privacy.sampling", "'poisson'", "'fixed'"]),
        ({**NOISE, "accountant": "gdp"}, {}, ["privacy.accountant", "'rdp'", "'prv'"]),
        ({**NOISE, "noise_cohort_size": 0}, {}, ["privacy.noise_cohort_size", "greater than or equal to 1"]),
        ({**NOISE, "max_epsilon": 0}, {}, ["privacy.max_epsilon", "greater than 0"]),
        ({**NOISE, "min_group_size": 0}, {}, ["privacy.min_group_size", "greater than or equal to 1"]),
        ({**NOISE, "nosie": 1}, {}, ["privacy.nosie", "unknown key"]),
        ({**NOISE, "adaptive_clip": {"target_quantile": 1.0}}, {}, ["privacy.adaptive_clip.target_quantile", "less than 1"]),
        ({**NOISE, "adaptive_clip": {"learning_rate": 0}}, {}, ["privacy.adaptive_clip.learning_rate", "greater than 0"]),
        (NOISE, {"protocol": {"mode": "async"}}, ["privacy with protocol.mode: async", "set protocol.mode: sync", "remove the privacy section"]),
        (NOISE, {"protocol": {"stragglers": {"policy": "drop", "deadline": 5.0}}},
         ["privacy.sampling: poisson", "protocol.stragglers.policy: drop", "wait_all", "privacy.sampling: fixed"]),
        (NOISE, {"protocol": {"stragglers": {"policy": "over_select"}}}, ["protocol.stragglers.policy: over_select"]),
        (NOISE, {"protocol": {"availability": {"kind": "bernoulli", "probability": 0.5}}},
         ["privacy.sampling: poisson", "protocol.availability.kind: bernoulli", "always", "privacy.sampling: fixed"]),
        # the run's own checks, where it is prepared (validate runs them too)
        pytest.param({"target_epsilon": 1e-6}, {}, ["privacy.target_epsilon: 1e-06 cannot be reached", "raise privacy.target_epsilon"], marks=needs_accountant),
        pytest.param({**NOISE, "max_epsilon": 0.01}, {}, ["privacy.max_epsilon: 0.01 is below the epsilon of round 1's release"], marks=needs_accountant),
        ({**NOISE, "adaptive_clip": {}}, {}, ["privacy.adaptive_clip.count_noise_multiplier: null", "must exceed z"]),
        ({**NOISE, "adaptive_clip": {"count_noise_multiplier": 0.4}}, {}, ["privacy.adaptive_clip.count_noise_multiplier: 0.4", "must exceed z"]),
    ],
)  # fmt: skip
@pytest.mark.parametrize("command", ["validate", "simulate"])
def test_bad_privacy_settings_exit_2_naming_the_key(dp_method, write_scenario, tmp_path, command, privacy, sections, expected) -> None:
    protocol = {"rounds": 3, **sections.get("protocol", {})}
    path = write_scenario(private_scenario(privacy, protocol=protocol))
    assert_refused(command, path, tmp_path, expected)


@pytest.mark.parametrize("command", ["validate", "simulate"])
def test_a_method_without_a_privacy_rule_is_refused_naming_those_with_one(dp_method, write_scenario, tmp_path, command) -> None:
    path = write_scenario(private_scenario(NOISE, method=dp_test_method.REFUSING_NAME))
    expected = [f"privacy with algorithm.name: {dp_test_method.REFUSING_NAME}", "remove the privacy section", dp_test_method.NAME]
    assert_refused(command, path, tmp_path, expected)


def test_poisson_sampling_refuses_a_trace_with_availability_windows(dp_method, write_scenario, tmp_path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("client_id,speed,delay,available_from,available_until\n0,100,0,0,50\n")
    path = write_scenario(private_scenario(NOISE, protocol={"system": {"trace": str(trace)}}))
    assert_refused("validate", path, tmp_path, ["privacy.sampling: poisson with protocol.system.trace", "privacy.sampling: fixed"])


def test_a_missing_accountant_exits_2_naming_the_extra(dp_method, write_scenario, tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "opacus.accountants", None)  # Opacus cannot be imported
    for privacy in (NOISE, {"target_epsilon": 4.0}):
        path = write_scenario(private_scenario(privacy))
        assert_refused("validate", path, tmp_path, ["pip install 'hdcfl-ray[dp]'"])


def test_set_creates_the_privacy_section(dp_method, write_scenario) -> None:
    path = write_scenario(tiny_scenario(algorithm={"name": dp_test_method.NAME}))
    assert load_scenario(path).privacy is None
    scenario = load_scenario(path, ["privacy.target_epsilon=4", "privacy.adaptive_clip.target_quantile=0.7"])
    assert scenario.privacy is not None and scenario.privacy.target_epsilon == 4.0
    assert scenario.privacy.adaptive_clip is not None and scenario.privacy.adaptive_clip.target_quantile == 0.7
    assert scenario.privacy.noise_multiplier is None and scenario.privacy.clip == 1.0


def test_a_scenario_without_the_section_runs_as_before(dp_method) -> None:
    scenario = build_scenario(tiny_scenario(algorithm={"name": dp_test_method.NAME}))
    assert scenario.privacy is None and "privacy" not in comparable(scenario)  # fingerprints as before the section existed
    assert prepare_run(scenario).privacy is None
    assert dp_test_method.BUILT_WITH[-1] is None


def test_every_privacy_key_changes_the_setting(dp_method) -> None:
    plain = build_scenario(tiny_scenario(algorithm={"name": dp_test_method.NAME}))
    private = build_scenario(private_scenario(NOISE))
    noisier = build_scenario(private_scenario({"noise_multiplier": 1.5}))
    assert not any(may_differ(key) for key in comparable(private) if key.startswith("privacy."))
    added = {change.key for change in setting_changes(plain, private)}
    assert {"privacy.noise_multiplier", "privacy.clip", "privacy.delta", "privacy.sampling", "privacy.accountant"} <= added
    assert [change.describe() for change in setting_changes(private, noisier)] == ["privacy.noise_multiplier: 1.0 -> 1.5"]


@needs_accountant
def test_the_run_resolves_q_and_the_planned_rounds(dp_method) -> None:
    # 8 clients, 2 of them newcomers: 6 train; participation 3 of them: q = 0.5
    scenario = build_scenario(
        private_scenario({**NOISE, "clip": 0.5, "noise_cohort_size": 30}, protocol={"rounds": 3, "participation": 3}, partition={"newcomers": 2})
    )
    privacy = prepare_run(scenario).privacy
    assert privacy is not None
    assert (privacy.noise_multiplier, privacy.clip, privacy.sample_rate, privacy.rounds) == (1.0, 0.5, 0.5, 3)
    assert (privacy.training_clients, privacy.expected_cohort, privacy.noise_cohort_factor) == (6, 3.0, 0.1)
    assert privacy.sum_noise_std() == pytest.approx(1.0 * 0.5 * 0.1)
    assert privacy.planned_releases(1) == ((1.0, 0.5, 1),) and privacy.planned_releases(4) == ()
    assert dp_test_method.BUILT_WITH[-1] == privacy  # the method is built with what the run resolved
    fixed = prepare_run(build_scenario(private_scenario({**NOISE, "sampling": "fixed"}, protocol={"participation": 3}))).privacy
    assert fixed is not None and fixed.sample_rate == 1.0 and fixed.expected_cohort == 3.0  # accounted without amplification


@needs_accountant
def test_target_epsilon_chooses_z_for_the_planned_rounds(dp_method) -> None:
    from hdcfl_ray.privacy.accountant import epsilon

    scenario = build_scenario(private_scenario({"target_epsilon": 3.0, "delta": 1e-3}, protocol={"rounds": 5, "participation": 0.5}))
    privacy = prepare_run(scenario).privacy
    assert privacy is not None and privacy.target_epsilon == 3.0
    spent = epsilon([(privacy.noise_multiplier, 0.5, 5)], 1e-3)
    assert 3.0 - 0.01 <= spent <= 3.0


@needs_accountant
def test_adaptive_clipping_splits_z_between_the_count_and_the_update(dp_method) -> None:
    scenario = build_scenario(private_scenario({**NOISE, "adaptive_clip": {"count_noise_multiplier": 2.0}}))
    privacy = prepare_run(scenario).privacy
    assert privacy is not None and privacy.adaptive_clip is not None
    update = privacy.adaptive_clip.update_noise_multiplier
    assert privacy.adaptive_clip.count_noise_std == 2.0
    assert update**-2 + (2 * 2.0) ** -2 == pytest.approx(1.0)  # together one mechanism of z = 1
    assert privacy.sum_noise_std() == pytest.approx(update * privacy.clip)


def test_a_rule_planning_releases_at_some_rounds_plans_each_rounds_share() -> None:
    # one release a round, and a descriptor release at half the noise from round 2 on, every other round
    def planned(params, rounds, total):
        return ((1.0, rounds), (0.5, len(range(2, rounds + 1, 2))))

    assert round_plan(PrivacyRule(sends="x", planned_releases=planned), None, 4) == (
        ((1.0, 1),), ((1.0, 1), (0.5, 1)), ((1.0, 1),), ((1.0, 1), (0.5, 1)),
    )  # fmt: skip
    with pytest.raises(ValueError, match="only grow"):
        round_plan(PrivacyRule(sends="x", planned_releases=lambda params, rounds, total: ((1.0, total - rounds),)), None, 2)

