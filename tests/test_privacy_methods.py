"""The methods that accept a privacy section: what leaves a client is a clipped update
(and HDC-FL's unit-norm head sketch at a refresh, FedSoft's importance weights, FedCE's
shares), never a
model, an encoder or a head (Local sends nothing at all);
a round's mechanism is what docs/privacy.md says; a stopped run resumes to the
uninterrupted run's bits; the methods without a rule refuse (exit 2)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from typer.testing import CliRunner

from cli import app
from hdcfl_ray.algorithms.private_updates import UPDATE, WITHIN_CLIP, group_update_key
from hdcfl_ray.algorithms.registry import method_specs
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.algorithms.private_updates import bounded_shares, released_group_means, released_per_group_means
from hdcfl_ray.contract import ModelParams, ResolvedPrivacy, Upload
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.terminal.live_view import QuietObserver
from tests.conftest import ACCOUNTANT_MISSING, slow_beyond, tiny_scenario
from tests.stop_observer import resume_after_a_stop

pytest.importorskip("opacus", reason=ACCOUNTANT_MISSING)

PRIVATE_METHODS = ("fedavg", "fedavg_se", "hdcfl", "ifca", "fedprox", "local", "fedrep", "fedbabu", "ditto", "apfl", "fedala", "fedsoft", "fedce")
# besides the within-clip bit: IFCA's chosen cluster and HDC-FL's unit-norm head sketch (docs/privacy.md);
# FedSoft's importance weights u_k, which the server uses only as the weights of the client's
# update and count in the one noised release, scaled to sum to at most one there, so the
# release's sensitivity holds whatever a client sends; FedCE's shares of the components it trained,
# used the same way
ALLOWED_VALUES = {WITHIN_CLIP, "cluster", "head_sketch", "importance", "shares"}
# the methods whose head never leaves the client (or, FedBABU, is the public h_0): an encoder update only
ENCODER_ONLY = {"fedavg_se", "hdcfl", "fedrep", "fedbabu"}
CLIP = 0.5


def private(method: str, rounds: int = 3, **privacy: object) -> dict:
    return tiny_scenario(
        algorithm={"name": method, "ifca": {"clusters": 2}, "fedsoft": {"centers": 2}, "fedce": {"clusters": 2, "temperature": 2.0}},
        privacy={"noise_multiplier": 1.0, "clip": CLIP, "noise_cohort_size": 500, **privacy},
        protocol={"rounds": rounds, "participation": 4},
        runtime={"backend": "local", "num_cpus": 1},
    )


def test_the_methods_that_accept_privacy_are_the_ones_with_a_rule() -> None:
    accepting = sorted(name for name, spec in method_specs().items() if spec.privacy is not None)
    assert set(PRIVATE_METHODS) <= set(accepting)


@pytest.mark.parametrize("method", slow_beyond(PRIVATE_METHODS, fast={"fedavg", "hdcfl", "ifca", "apfl", "fedsoft"}))
def test_what_leaves_a_client_is_a_clipped_update_never_a_model(method: str, tmp_path, monkeypatch) -> None:
    seen: list[Upload] = []
    spec = method_specs()[method]
    built_class = _method_class(method)
    original = built_class.aggregate

    def recording(self, state, round_index, uploads):
        seen.extend(uploads)
        return original(self, state, round_index, uploads)

    monkeypatch.setattr(built_class, "aggregate", recording)
    run_simulation(prepare_run(build_scenario(private(method))), tmp_path / "run", QuietObserver())
    assert seen, f"{spec.name}: no upload reached the server"
    for upload in seen:
        if method == "local":  # shares nothing: counts only
            assert not upload.models and not upload.values
            continue
        # one clipped update, or (FedSoft) one per centre, each its model minus that centre's,
        # or (FedCE) one per component the client trained, its trained copy minus the component
        if method == "fedsoft":
            assert set(upload.models) == {group_update_key(s) for s in range(2)}, upload.models.keys()
        elif method == "fedce":
            assert upload.models and set(upload.models) <= {group_update_key(s) for s in range(2)}, upload.models.keys()
            shares = np.asarray(upload.values["shares"])
            assert shares.shape == (2,) and 0.0 < shares.sum() <= 1.0 + 1e-9
            # a share for exactly the components it sends an update of
            assert {group_update_key(s) for s in np.flatnonzero(shares > 0)} == set(upload.models)
        else:
            assert set(upload.models) == {UPDATE}, upload.models.keys()
        assert set(upload.values) <= ALLOWED_VALUES, upload.values.keys()
        for update in upload.models.values():
            assert isinstance(update, ModelParams)
            parts = [update.encoder] + ([] if update.head is None else [update.head])
            norm = math.sqrt(sum(float(np.sum(np.asarray(part, np.float64) ** 2)) for part in parts))
            assert norm <= CLIP * (1 + 1e-5)
            if method in ENCODER_ONLY:
                assert update.head is None  # the head stays on the client
        if "importance" in upload.values:
            assert np.sum(upload.values["importance"]) == pytest.approx(1.0) and len(upload.values["importance"]) == 2
        if "head_sketch" in upload.values:
            assert 0.0 < np.linalg.norm(upload.values["head_sketch"]) <= 1.0 + 1e-9  # a projection of the unit head
    if method == "hdcfl":
        assert any("head_sketch" in upload.values for upload in seen)
    if method == "fedsoft":
        assert all("importance" in upload.values for upload in seen)
    if method == "fedce":
        assert all("mixing" not in upload.values and "mass" not in upload.values for upload in seen)


CLASSES = {
    "fedavg": "FedAvg",
    "fedavg_se": "FedAvgSE",
    "hdcfl": "HDCFL",
    "ifca": "IFCA",
    "fedprox": "FedProx",
    "local": "LocalOnly",
    "fedrep": "FedRep",
    "fedbabu": "FedBABU",
    "ditto": "Ditto",
    "apfl": "APFL",
    "fedala": "FedALA",
    "fedsoft": "FedSoft",
    "fedce": "FedCE",
}


def _method_class(method: str) -> type:
    import importlib

    return getattr(importlib.import_module(f"hdcfl_ray.algorithms.{method}"), CLASSES[method])


@pytest.mark.parametrize("method", slow_beyond(("hdcfl", "ifca", "fedsoft", "fedrep", "fedce"), fast={"hdcfl", "fedce"}))
def test_a_private_run_resumes_to_the_uninterrupted_runs_bits(method: str, tmp_path) -> None:
    scenario = build_scenario(private(method, rounds=4, adaptive_clip={"count_noise_multiplier": 5.0}))
    resume_after_a_stop(scenario, tmp_path, stop_after=2)


def test_hdcfl_under_privacy_logs_its_groups_and_spends_six_releases_at_a_refresh(tmp_path) -> None:
    from hdcfl_ray.logs.table_writer import read_table
    from hdcfl_ray.privacy.accountant import epsilon

    run_dir = tmp_path / "run"
    scenario = build_scenario(private("hdcfl", rounds=3))
    prepared = prepare_run(scenario)
    run_simulation(prepared, run_dir, QuietObserver())
    refresh = read_table(run_dir, "refresh").to_pylist()
    assert {row["round"] for row in refresh} == {2, 3}  # activation_round 2, refresh_every 1
    q = 4 / 8  # participation 4 of the 8 clients, Poisson
    rounds = sorted(read_table(run_dir, "rounds").to_pylist(), key=lambda row: row["round"])
    # round 1: the encoder's mean; rounds 2 and 3: the encoder's mean, four releases on the sketches and the group sums
    expected = [epsilon([(1.0, q, steps)], 1e-5) for steps in (1, 7, 13)]
    assert [row["epsilon"] for row in rounds] == pytest.approx(expected, rel=1e-9)


def test_local_releases_nothing_and_target_epsilon_leaves_its_epsilon_at_zero(tmp_path) -> None:
    from hdcfl_ray.logs.table_writer import read_table

    run_dir = tmp_path / "run"
    prepared = prepare_run(build_scenario(private("local", noise_multiplier=None, target_epsilon=4.0)))
    run_simulation(prepared, run_dir, QuietObserver())
    assert [row["epsilon"] for row in read_table(run_dir, "rounds").to_pylist()] == [0.0, 0.0, 0.0]


def test_fedsoft_under_privacy_refuses_a_selection_mode_that_replaces_the_sample() -> None:
    scenario = private("fedsoft")
    scenario["algorithm"]["fedsoft"]["selection_mode"] = "select"
    with pytest.raises(ScenarioError, match="algorithm.fedsoft.selection_mode: select"):
        prepare_run(build_scenario(scenario))


def _privacy(min_group_size: int = 1) -> ResolvedPrivacy:
    return ResolvedPrivacy(
        noise_multiplier=1.0, clip=CLIP, sampling="poisson", sample_rate=0.5, expected_cohort=4.0, training_clients=8,
        rounds=3, delta=1e-5, accountant="rdp", min_group_size=min_group_size,
    )


def _update_upload(client_id: int, update: np.ndarray, groups: int = 0) -> Upload:
    """An upload of `update`, under UPDATE, or (groups > 0) as the update against each of that many groups."""
    model = ModelParams(encoder=update.astype(np.float32))
    keys = [group_update_key(g) for g in range(groups)] if groups else [UPDATE]
    return Upload(client_id, 10, 0.0, 1, models={key: model for key in keys})


def test_weighted_group_release_with_one_hot_weights_is_the_group_release_bit_for_bit() -> None:
    rng = np.random.default_rng(0)
    updates = [rng.normal(size=6) * 0.1 for _ in range(5)]
    uploads = [_update_upload(k, update) for k, update in enumerate(updates)]
    groups = [0, 2, 0, 1, 2]
    current = ModelParams(encoder=np.zeros(6, np.float32))
    hard = released_group_means(_privacy(), CLIP, list(zip(groups, uploads)), 3, current, with_head=False, seed=3, round_index=2)
    one_hot = [(np.eye(3)[group], _update_upload(k, update, groups=3)) for k, (group, update) in enumerate(zip(groups, updates))]
    soft = released_per_group_means(_privacy(), CLIP, one_hot, 3, current, with_head=False, seed=3, round_index=2)
    assert soft.counts == hard.counts
    for a, b in zip(soft.means, hard.means):
        assert (a is None and b is None) or np.array_equal(a.encoder, b.encoder)


def test_weighted_group_release_spreads_each_client_over_the_groups_by_its_weights() -> None:
    current = ModelParams(encoder=np.zeros(4, np.float32))
    members = [
        (np.array([0.75, 0.25]), _update_upload(0, np.full(4, 0.2), groups=2)),
        (np.array([0.5, 0.5]), _update_upload(1, np.full(4, -0.1), groups=2)),
    ]
    noiseless = ResolvedPrivacy(**{**_privacy().__dict__, "noise_cohort_size": 10**12})  # the noise scaled to nothing
    release = released_per_group_means(noiseless, CLIP, members, 2, current, with_head=False, seed=0, round_index=1)
    assert release.counts == pytest.approx([1.25, 0.75], abs=1e-6)
    # the first group's mean is its weighted mean update; the second's weighted count is below one client
    assert np.allclose(release.means[0].encoder, (0.75 * 0.2 - 0.5 * 0.1) / 1.25, atol=1e-6)
    assert release.means[1] is None


def test_bounded_shares_caps_a_clients_total_weight_at_one() -> None:
    assert bounded_shares(np.array([0.5, 0.25]), 2).tolist() == [0.5, 0.25]
    assert bounded_shares(np.array([3.0, -1.0, 1.0]), 3).tolist() == [0.75, 0.0, 0.25]
    with pytest.raises(ValueError, match="2 finite numbers"):
        bounded_shares(np.array([0.5, np.nan]), 2)


def test_a_method_without_a_privacy_rule_is_refused_naming_it(write_scenario) -> None:
    refused = sorted(name for name, spec in method_specs().items() if spec.privacy is None)
    assert refused, "every method accepts privacy: pick another check"
    path = write_scenario(private(refused[0]))
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    assert "privacy" in result.output and refused[0] in result.output
    reason = method_specs()[refused[0]].no_privacy_reason
    assert reason, f"{refused[0]} refuses privacy without saying why (MethodSpec.no_privacy_reason)"
    assert " ".join(reason.split()[:6]) in " ".join(result.output.split())


def test_a_diverged_update_is_sent_as_zeros_outside_the_clip() -> None:
    from hdcfl_ray.algorithms.private_updates import clipped_update

    start = ModelParams(encoder=np.zeros(4, np.float32), head=np.zeros(2, np.float32))
    trained = ModelParams(encoder=np.array([1.0, np.nan, 0.0, 0.0], np.float32), head=np.ones(2, np.float32))
    update, norm = clipped_update(start, trained, CLIP, with_head=True)
    assert math.isinf(norm)
    assert not update.encoder.any() and not update.head.any()
