"""What makes two runs one setting (hdcfl_ray/config/fingerprint.py): every key of the
resolved scenario but the seed, the name, the method and its section, the row's label,
what a run keeps on disk and the keys a rerun may change. The keys that change the
arithmetic are part of it; `auto` is compared as written."""

from __future__ import annotations

import pytest

from hdcfl_ray.config import safe_keys
from hdcfl_ray.config.fingerprint import method_knobs, setting_fingerprint, setting_keys
from hdcfl_ray.config.loading import build_scenario, load_scenario
from hdcfl_ray.sweeps import changes
from tests.conftest import tiny_scenario

QUICKSTART = "scenarios/quickstart.yaml"


def fingerprint(*overrides: str) -> str:
    return setting_fingerprint(load_scenario(QUICKSTART, list(overrides)))


@pytest.mark.parametrize(
    "override",
    [
        "seed=17",
        "name=another-name",
        "output.label=hdcfl-again",
        "output.save_refresh_cache=true",
        "checkpoint.every=1",
        "output.dir=elsewhere",
        "runtime.max_restarts=0",
        "runtime.backend=ray",
        "algorithm.ifca.clusters=7",  # another method's section: not what this run computes
        "algorithm.hdcfl.mix=0.0",  # the method's own knob: a row of its own, not another setting
        "algorithm.name=local",
    ],
)
def test_keys_that_do_not_make_a_setting_leave_the_fingerprint_alone(override):
    assert fingerprint(override) == fingerprint()


@pytest.mark.parametrize(
    "overrides",
    [
        ("partition.kind=label_subset", "partition.k=3"),
        ("protocol.rounds=5",),
        ("protocol.optimizer.lr=0.1",),
        ("dataset.pretrain_pool=0.2",),
        ("partition.validation_fraction=0.2",),
        # the arithmetic: not replicates of one another, though a rerun keeps the seed
        ("runtime.precision=bf16",),
        ("runtime.torch_threads=2",),
        ("runtime.num_cpus_per_actor=2",),  # torch_threads auto: two threads per host
        ("runtime.batched_evaluation=false",),
        # auto is compared as written, whatever a run resolves it to (fp32 on this CPU)
        ("runtime.precision=auto",),
    ],
)
def test_what_the_scenario_says_changes_the_fingerprint(overrides):
    assert fingerprint(*overrides) != fingerprint()


def test_setting_keys_are_flat_and_leave_out_the_method_and_the_seed():
    keys = setting_keys(load_scenario(QUICKSTART))
    assert keys["partition.kind"] == "rotation" and keys["protocol.rounds"] == 30
    assert keys["runtime.torch_threads"] == 1 and keys["runtime.num_gpus_per_actor"] == "CPU"  # as resolved
    assert not any(key.startswith("algorithm.") for key in keys)
    assert {"seed", "name", "output.label", "runtime.backend", "checkpoint.every"}.isdisjoint(keys)
    assert "protocol.rounds" not in setting_keys(load_scenario(QUICKSTART), leave_out=["protocol.rounds"])


def test_the_fingerprint_is_short_and_stable():
    value = fingerprint()
    assert len(value) == 16 and int(value, 16) >= 0
    assert fingerprint() == value


def test_method_knobs_are_the_running_methods_own_section():
    scenario = build_scenario(tiny_scenario(algorithm={"name": "ifca", "ifca": {"clusters": 3}}))
    assert method_knobs(scenario)["clusters"] == 3
    assert method_knobs(build_scenario(tiny_scenario(algorithm={"name": "local"}))) == {}


def test_sweep_reruns_and_resume_share_one_definition_of_safe_keys():
    assert changes.may_differ is safe_keys.may_differ and changes.ARITHMETIC_KEYS is safe_keys.ARITHMETIC_KEYS
    assert safe_keys.may_differ("runtime.num_cpus_per_actor") and not safe_keys.may_differ("runtime.precision")
