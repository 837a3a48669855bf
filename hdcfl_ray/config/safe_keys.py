"""Which scenario keys may differ between a run and its rerun: the one definition of
"safe to change", for sweep reruns (hdcfl_ray/sweeps/changes.py), `simulate --resume`
(a resume compares the scenario on disk, and its --set keys, with the one the run
recorded when it started) and the settings reports group runs by
(hdcfl_ray/config/fingerprint.py)."""

from __future__ import annotations

import os
from typing import Any

from hdcfl_ray.config.schema import Scenario

# Keys that say where and how a run executes or how often it saves itself, not what
# it computes: they may differ between a run and its rerun. (output.dir is not used
# by sweeps, which place every run under --out, and checkpoints do not change a
# run's results, nor do the experiment trackers that also receive them.)
RERUN_SAFE_PREFIXES = ("runtime.",)
RERUN_SAFE_KEYS = frozenset({"output.dir", "checkpoint.every", "output.trackers", "output.mlflow_uri"})
# runtime keys that change the arithmetic itself, so a run's rounds must all share
# them. Three are compared as resolved, not as written: runtime.torch_threads as the
# threads each host trains with ("auto" is runtime.num_cpus_per_actor, so changing
# that changes the bits too), runtime.num_gpus_per_actor as CPU or CUDA (a host
# trains on CUDA exactly when it has a share; the size of the share does not matter),
# runtime.batched_training as on or off ("auto" is on exactly for CUDA hosts).
ARITHMETIC_KEYS = (
    "runtime.precision",
    "runtime.channels_last",
    "runtime.cuda_deterministic",
    "runtime.cuda_tf32",
    "runtime.torch_threads",
    "runtime.batched_evaluation",
    "runtime.num_gpus_per_actor",
    "runtime.batched_training",
    "runtime.portable",  # the instruction sets every process computes with (docs/same-results.md)
)


def may_differ(key: str) -> bool:
    """Whether the dotted `key` may differ between a run and its rerun or resume."""
    return key in RERUN_SAFE_KEYS or (key.startswith(RERUN_SAFE_PREFIXES) and key not in ARITHMETIC_KEYS)


def safe_keys_text() -> str:
    """The keys that may differ, in words, for messages."""
    return f"runtime.* (but {', '.join(ARITHMETIC_KEYS)}), " + " and ".join(sorted(RERUN_SAFE_KEYS))


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """{"protocol": {"rounds": 3}} -> {"protocol.rounds": 3}; lists stay values."""
    if isinstance(value, dict):
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix: value}


def own_sections(raw: dict[str, Any]) -> dict[str, Any]:
    """A scenario without the sections of methods it does not run: every scenario carries
    each method's settings, but only `algorithm.<name>` can change what a run computes,
    so a calibration of IFCA must not invalidate finished HDC-FL runs (nor a renamed
    FedCE key make them unreadable)."""
    algorithm = raw.get("algorithm")
    if not isinstance(algorithm, dict):
        return raw
    name = algorithm.get("name")
    return {**raw, "algorithm": {key: value for key, value in algorithm.items() if key in ("name", name)}}


def comparable(scenario: Scenario) -> dict[str, Any]:
    """A scenario's keys, flat, as compared between a run and its rerun or resume: only
    the running method's own section, and the arithmetic keys that are compared as
    resolved (see ARITHMETIC_KEYS) replaced by what they resolve to, and `dataset.path`
    by the folder it names."""
    from hdcfl_ray.config.runtime_resolved import torch_threads_per_host
    from hdcfl_ray.config.runtime_resolved import trains_batched

    flat = flatten(own_sections(scenario.model_dump(mode="json")))
    if scenario.privacy is None:
        # an absent privacy section is no key at all, so a scenario written before the section
        # existed keeps its setting (reports' groups, the auto-knob cache's fingerprints); a
        # run with one differs from a run without in every privacy.* key
        del flat["privacy"]
    flat["runtime.torch_threads"] = torch_threads_per_host(scenario.runtime)
    flat["runtime.num_gpus_per_actor"] = "CUDA" if scenario.runtime.num_gpus_per_actor > 0 else "CPU"
    flat["runtime.batched_training"] = trains_batched(scenario.runtime)
    if isinstance(flat.get("dataset.path"), str):
        flat["dataset.path"] = data_location(flat["dataset.path"])
    return flat


def data_location(path: str) -> str:
    """`dataset.path` as the folder it names: `../shared/data` from the repository root and
    `/work/shared/data` are one folder, so a rerun that spells it the other way (an
    environment variable set relative, then absolute) is the same setting."""
    return os.path.realpath(os.path.expanduser(path))
