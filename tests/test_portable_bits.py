"""Portable runs give the same bits on every machine; default-mode runs do not.

Other machines are imitated from outside on this one (tests/portable_runs.py): the
instruction sets oneDNN, MKL, ATen, OpenBLAS and numpy may use are capped, as a
CPU without AVX512 or an older one would cap them, and thread counts change. Each
run is a fresh `hdcfl-ray simulate` process, since the libraries read the caps when
they load. The default mode's clients tables differ between the imitated machines
(so these tests can fail); the portable mode's are identical, on the local backend
and on Ray hosts whose nodes were started under the caps. One golden file of
portable bits (tests/golden/quickstart-seed42-3rounds-portable.json) holds on
every machine: on a machine where it does not, the pins miss a library there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hdcfl_ray.portable.environment import portable_environment
from tests.bit_reference import PORTABLE_GOLDEN
from tests.portable_runs import MACHINES, REPO, clients_rows, quickstart, resnet_round, simulate
from tests.portable_runs import imitating as imitating_machine

PORTABLE, DEFAULT = "runtime.portable=true", "runtime.portable=false"


@pytest.mark.slow  # a long end-to-end run: the slow tier (.ci/run runs it after the README's command)
def test_quickstart_rounds_have_the_same_bits_on_a_machine_without_avx2_caps_and_one_host(tmp_path: Path) -> None:
    """This machine with two hosts, against an imitated SSE-era machine (MKL's
    compatible branch, oneDNN at SSE4.1) with one host."""
    here, other = quickstart(num_cpus=2), quickstart(num_cpus=1)
    default_here = clients_rows(simulate(here, tmp_path / "default-here", "this machine", DEFAULT))
    default_other = clients_rows(simulate(other, tmp_path / "default-other", "sse", DEFAULT))
    assert default_here != default_other, "the caps must change the default mode's bits, or this test proves nothing"
    portable_here = clients_rows(simulate(here, tmp_path / "portable-here", "this machine", PORTABLE))
    portable_other = clients_rows(simulate(other, tmp_path / "portable-other", "sse", PORTABLE))
    assert len(portable_here) == 2 * 20  # two rounds, every client scored
    assert portable_here == portable_other
    manifest = json.loads((tmp_path / "portable-other" / "manifest.json").read_text())
    record = manifest["arithmetic"]
    assert record["portable"] and record["pinned"] == portable_environment()
    assert record["replaced"] == {"MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41"}  # the caps the pins overrode
    assert record["in_effect"]["aten"] == "AVX2" and record["in_effect"]["mkl"] == portable_environment()["MKL_CBWR"]
    assert all(host["arithmetic"]["portable"] and host["torch_threads"] == 1 for host in manifest["client_host_hardware"])


def _distinct(tables: dict[str, list[tuple]]) -> int:
    return len({repr(rows) for rows in tables.values()})


@pytest.mark.slow
def test_quickstart_is_identical_under_every_imitated_machine_and_host_count(tmp_path: Path) -> None:
    default, portable = {}, {}
    for index, machine in enumerate(MACHINES):
        for hosts in (1, 2):
            name = f"{index}-{hosts}"
            scenario = quickstart(num_cpus=hosts)
            portable[f"{machine}, {hosts} hosts"] = clients_rows(simulate(scenario, tmp_path / f"p{name}", machine, PORTABLE))
            if hosts == 1:
                default[machine] = clients_rows(simulate(scenario, tmp_path / f"d{name}", machine, DEFAULT))
    # on an AVX2-only CPU the AVX-512 imitation cannot raise what the CPU lacks: two kinds of
    # default-mode bits at least (the SSE imitation always differs), three on an AVX-512 CPU
    assert _distinct(default) >= 2, f"the imitated machines must differ in the default mode on {_machine()}"
    assert _distinct(portable) == 1, {name: rows[-1] for name, rows in portable.items()}


@pytest.mark.slow
def test_a_resnet18_round_is_identical_under_every_imitated_machine(tmp_path: Path) -> None:
    """A CIFAR-shaped ResNet-18 round: oneDNN's convolutions and batch norm at scale."""
    default, portable = {}, {}
    for index, machine in enumerate(MACHINES):
        scenario = resnet_round(num_cpus=1 + index % 2)
        portable[machine] = clients_rows(simulate(scenario, tmp_path / f"p{index}", machine, PORTABLE))
        default[machine] = clients_rows(simulate(scenario, tmp_path / f"d{index}", machine, DEFAULT))
    assert _distinct(default) >= 2, "the imitated machines must differ in the default mode"
    assert _distinct(portable) == 1


@pytest.mark.slow
def test_ray_hosts_on_nodes_started_under_other_caps_compute_the_local_backends_bits(tmp_path: Path) -> None:
    """Two Ray nodes started in an imitated machine's environment, which their host
    workers inherit: a portable run's runtime_env pins them anyway; a default-mode
    run's hosts compute with the caps."""
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(quickstart()))
    # not this session's Ray: its address, nor the token authentication its ray.init exported
    # (the child's cluster_utils nodes would start in that mode with no token, and cancel every
    # actor that has a runtime_env: a portable run's hosts)
    environment = {key: value for key, value in os.environ.items() if key not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    environment.update(portable_environment())
    completed = subprocess.run(
        [sys.executable, "-m", "tests.portable_cluster_run", str(path), "sse", str(tmp_path / "cluster")],
        cwd=REPO, env=environment, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-4000:]
    cluster = json.loads((tmp_path / "cluster" / "result.json").read_text())
    assert cluster["portable"]["nodes"] == cluster["cluster_nodes"]  # hosts on both nodes
    assert all(started["ONEDNN_MAX_CPU_ISA"] == "AVX2" for started in cluster["portable"]["hosts_started_with"])
    assert all(started["ONEDNN_MAX_CPU_ISA"] == "SSE41" for started in cluster["default"]["hosts_started_with"])
    local_portable = clients_rows(simulate(quickstart(), tmp_path / "local-portable", "this machine", PORTABLE))
    local_default = clients_rows(simulate(quickstart(), tmp_path / "local-default", "this machine", DEFAULT))
    assert [tuple(row) for row in cluster["default"]["rows"]] != local_default
    assert [tuple(row) for row in cluster["portable"]["rows"]] == local_portable


def _portable_rows(methods: list[str], machine: str, extra_environment: dict[str, str] | None = None) -> dict[str, list]:
    """`python -m tests.bit_reference --portable --print METHODS` under `machine`'s caps."""
    completed = subprocess.run(
        [sys.executable, "-m", "tests.bit_reference", "--portable", "--print", *methods],
        cwd=REPO, env={**imitating_machine(machine), **(extra_environment or {})}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-4000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


def test_portable_bits_equal_the_one_golden_file_of_every_machine() -> None:
    """HDC-FL (the server's numpy eigendecomposition) and PACFL (numpy SVDs), under an
    imitated AVX2 machine: the golden file was recorded on an AMD EPYC (Zen 4), and an
    Intel Xeon and an AVX2-only EPYC must compute it too."""
    golden = json.loads(PORTABLE_GOLDEN.read_text())
    rows = _portable_rows(["hdcfl", "pacfl"], "avx2")
    for method, method_rows in rows.items():
        assert method_rows == golden[method], f"{method}: portable bits moved on {_machine()}"


def _machine() -> str:
    from hdcfl_ray.portable.machine import cpu_facts, mkl_reproducibility

    cpu = cpu_facts()
    return f"{cpu['model']} ({cpu['vendor']}; {', '.join(cpu['instruction_sets'])}; MKL branch unpinned: {mkl_reproducibility()})"


def test_the_default_mode_differs_from_the_golden_portable_bits_under_a_cap() -> None:
    """So the golden test above can fail: the same runs in the default mode, capped as
    an AVX2 machine, are not the portable bits."""
    golden = json.loads(PORTABLE_GOLDEN.read_text())
    completed = subprocess.run(
        [sys.executable, "-c", "import json, sys, tempfile; from pathlib import Path; from tests.bit_reference import quickstart_rows; "
         "print(json.dumps(quickstart_rows('fedavg', Path(tempfile.mkdtemp()) / 'run')))"],
        cwd=REPO, env=imitating_machine("avx2"), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert json.loads(completed.stdout.strip().splitlines()[-1]) != golden["fedavg"]


@pytest.mark.slow  # a long end-to-end run: the slow tier (.ci/run runs it after the README's command)
def test_mkl_told_it_runs_on_the_other_vendor_moves_the_default_bits_but_not_the_portable_ones(tmp_path: Path) -> None:
    """What caps cannot imitate: MKL dispatches by vendor. Told it runs on the other
    vendor's CPU (tests/mkl_vendor.py), it changes a default-mode run; the portable
    run keeps the golden file's bits."""
    from tests import mkl_vendor

    if mkl_vendor.compiler() is None:
        pytest.skip("needs a C compiler (cc or gcc) to build the library that tells MKL another vendor; none on PATH")
    library = mkl_vendor.other_vendor_library(tmp_path)
    other = {"LD_PRELOAD": str(library)}
    here_default = clients_rows(simulate(quickstart(), tmp_path / "default-here", "this machine", DEFAULT))
    other_default = clients_rows(simulate(quickstart(), tmp_path / "default-other", "this machine", DEFAULT, extra_environment=other))
    assert here_default != other_default, (
        f"MKL told it runs on {mkl_vendor.other_vendor()} should compute differently on {_machine()}, or this test proves nothing"
    )
    golden = json.loads(PORTABLE_GOLDEN.read_text())
    rows = _portable_rows(["hdcfl", "fedavg"], "this machine", extra_environment=other)
    for method, method_rows in rows.items():
        assert method_rows == golden[method], f"{method}: portable bits moved with MKL told it runs on {mkl_vendor.other_vendor()}"


@pytest.mark.slow
def test_every_method_has_the_golden_portable_bits() -> None:
    from hdcfl_ray.algorithms.registry import method_names

    golden = json.loads(PORTABLE_GOLDEN.read_text())
    assert set(golden) == set(method_names())
    rows = _portable_rows(sorted(method_names()), "avx512, no amx, 4 threads")
    moved = [method for method in rows if rows[method] != golden[method]]
    assert not moved, f"portable bits moved: {moved}"


def _pretrained_weights(tmp_path: Path, name: str, machine: str, *overrides: str) -> dict:
    """`hdcfl-ray pretrain` of a small digits pool in a fresh process imitating `machine`."""
    import torch

    from tests.conftest import tiny_scenario
    from tests.portable_runs import imitating

    scenario = tiny_scenario(dataset={"name": "digits", "pretrain_pool": 0.25}, protocol={"batch_size": 16}, runtime={"num_cpus": 2})
    path, weights = tmp_path / f"{name}.yaml", tmp_path / f"{name}.pt"
    path.write_text(yaml.safe_dump(scenario, sort_keys=False))
    command = [sys.executable, "-m", "cli", "pretrain", str(path), "--out", str(weights), "--epochs", "2"]
    for override in overrides:
        command += ["--set", override]
    completed = subprocess.run(command, cwd=REPO, env=imitating(machine), capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, f"{machine}: {completed.stderr[-4000:]}"
    return torch.load(weights, weights_only=True)


@pytest.mark.slow  # a long end-to-end run: the slow tier (.ci/run runs it after the README's command)
def test_portable_pretraining_gives_the_same_weights_under_other_caps_and_records_its_arithmetic(tmp_path: Path) -> None:
    import torch

    def same(first: dict, second: dict) -> bool:
        return all(torch.equal(first[part][key], second[part][key]) for part in ("encoder", "head") for key in first[part])

    default_here = _pretrained_weights(tmp_path, "default-here", "this machine", DEFAULT)
    default_other = _pretrained_weights(tmp_path, "default-other", "sse", DEFAULT)
    assert not same(default_here, default_other), "the caps must change the default mode's weights, or this test proves nothing"
    portable_here = _pretrained_weights(tmp_path, "portable-here", "this machine", PORTABLE)
    portable_other = _pretrained_weights(tmp_path, "portable-other", "avx2", PORTABLE)
    assert same(portable_here, portable_other)
    record = portable_other["pretrain"]["arithmetic"]
    assert record["portable"] and record["pinned"] == portable_environment() and portable_other["pretrain"]["torch_threads"] == 1
    assert record["in_effect"]["mkl"] in (None, portable_environment()["MKL_CBWR"])
    assert default_here["pretrain"]["arithmetic"]["portable"] is False
