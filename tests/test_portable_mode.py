"""runtime.portable's rules, record and reporting: what a portable run computes with
and refuses, how the command comes to be pinned, what the manifest says about any
run's arithmetic, and how a report treats runs of different machines. The bits
themselves: tests/test_portable_bits.py."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.config.safe_keys import ARITHMETIC_KEYS, may_differ
from hdcfl_ray.config.schema import RuntimeConfig
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.portable import restart
from hdcfl_ray.portable.environment import portable_environment
from hdcfl_ray.portable.ray_options import with_portable_environment
from hdcfl_ray.config.runtime_resolved import torch_threads_per_host
from tests.conftest import tiny_scenario

REPO = Path(__file__).resolve().parents[1]


def test_portable_hosts_train_with_one_torch_thread_whatever_cpus_they_hold() -> None:
    assert torch_threads_per_host(RuntimeConfig(portable=True, num_cpus_per_actor=4)) == 1
    assert torch_threads_per_host(RuntimeConfig(portable=False, num_cpus_per_actor=4)) == 4  # the default mode as before


def test_a_host_given_more_cpus_is_told_it_trains_with_one_thread() -> None:
    from hdcfl_ray.portable.process import portable_notices

    (notice,) = portable_notices(RuntimeConfig(portable=True, num_cpus_per_actor=2))
    assert notice.startswith("runtime.portable: each host trains with one torch thread") and "2 CPUs" in notice
    assert portable_notices(RuntimeConfig(portable=False, num_cpus_per_actor=2)) == []


@pytest.mark.parametrize(
    ("runtime", "named"),
    [({"torch_threads": 2}, "runtime.torch_threads: 2"), ({"precision": "bf16"}, "runtime.precision: bf16")],
)
def test_a_portable_scenario_refuses_what_only_some_machines_compute_alike(runtime: dict, named: str) -> None:
    with pytest.raises(ScenarioError) as refused:
        build_scenario(tiny_scenario(runtime={"portable": True, **runtime}))
    assert named in str(refused.value) and "runtime.portable: false" in str(refused.value)
    build_scenario(tiny_scenario(runtime=runtime))  # fine in the default mode


def test_a_rerun_or_resume_may_not_switch_the_mode() -> None:
    assert "runtime.portable" in ARITHMETIC_KEYS and not may_differ("runtime.portable")


def test_the_environment_printed_for_a_python_session_is_the_portable_one() -> None:
    printed = subprocess.run([sys.executable, "-m", "hdcfl_ray.portable"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert dict(line.split("=", 1) for line in printed.splitlines()) == portable_environment()
    assert " " not in printed.replace("\n", "")  # `env $(python -m hdcfl_ray.portable) ...` splits on spaces


def test_a_python_session_started_without_the_pins_runs_a_portable_run_in_a_pinned_process(tmp_path: Path) -> None:
    """A notebook's kernel loaded its math libraries unpinned: the API runs the portable
    run in a fresh pinned process, with the command's bits."""
    import hdcfl_ray
    from hdcfl_ray.portable.process import unpinned_libraries
    from tests.portable_runs import clients_rows, simulate

    assert unpinned_libraries(), "the test session must not be pinned, or this test proves nothing"
    scenario = tiny_scenario(runtime={"portable": True, "backend": "local"}, protocol={"rounds": 2}, output={"dir": str(tmp_path)})
    run = hdcfl_ray.simulate(scenario, out=tmp_path / "api", progress=False)
    assert run.status == "completed" and run.manifest["arithmetic"]["portable"]
    assert run.manifest["arithmetic"]["in_effect"]["aten"] == "AVX2"
    command = simulate(scenario, tmp_path / "command", "this machine")
    assert clients_rows(run.dir) == clients_rows(command)


def test_a_portable_run_with_bad_input_in_the_pinned_process_raises_the_commands_error(tmp_path: Path) -> None:
    import hdcfl_ray

    scenario = tiny_scenario(runtime={"portable": True, "backend": "local"}, dataset={"name": "parquet_images", "path": str(tmp_path / "absent")})
    with pytest.raises(ScenarioError, match="absent"):
        hdcfl_ray.simulate(scenario, out=tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_the_command_restarts_itself_with_the_pins_keeping_what_they_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[tuple] = []
    monkeypatch.setattr(restart.os, "execve", lambda path, argv, environment: started.append((path, argv, environment)))
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    monkeypatch.delenv(restart.RESTARTED, raising=False)
    restart.restart_pinned_if_needed([build_scenario(tiny_scenario(runtime={"portable": True}))])
    (path, argv, environment), = started
    assert path == sys.executable and argv == sys.orig_argv  # the same command, as typed
    assert {name: environment[name] for name in portable_environment()} == portable_environment()
    assert json.loads(environment[restart.RESTARTED]) == {"MKL_CBWR": "COMPATIBLE"}
    restart.restart_pinned_if_needed([build_scenario(tiny_scenario())])  # a default-mode run: no restart
    assert len(started) == 1


def test_a_restarted_command_still_unpinned_says_why_instead_of_restarting_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(restart.os, "execve", lambda *args: pytest.fail("restarted twice"))
    monkeypatch.setenv(restart.RESTARTED, "{}")
    with pytest.raises(ScenarioError, match="did not start with the portable environment"):
        restart.restart_pinned_if_needed([build_scenario(tiny_scenario(runtime={"portable": True}))])


def test_a_library_that_ignores_its_pin_is_named_without_telling_the_user_to_restart(monkeypatch: pytest.MonkeyPatch) -> None:
    """Started with every pin and still computing elsewhere (MKL ignoring a branch it
    honours on one vendor only, as MKL_CBWR=AVX2 did on AMD): restarting cannot help."""
    from hdcfl_ray.portable import process

    monkeypatch.setattr(restart.os, "execve", lambda *args: pytest.fail("restarted twice"))
    monkeypatch.setenv(restart.RESTARTED, "{}")
    monkeypatch.setattr(process, "initial_environment", lambda: dict(portable_environment()))
    monkeypatch.setattr(process, "unpinned_libraries", lambda: ["MKL's reproducibility branch is auto,STRICT"])
    monkeypatch.setattr(restart, "unpinned_libraries", lambda: ["MKL's reproducibility branch is auto,STRICT"])
    with pytest.raises(ScenarioError) as refused:
        restart.restart_pinned_if_needed([build_scenario(tiny_scenario(runtime={"portable": True}))])
    message = str(refused.value)
    assert "MKL's reproducibility branch is auto,STRICT" in message and "ignores its pin" in message
    assert "env $(python -m hdcfl_ray.portable)" not in message


def test_one_command_runs_portable_and_default_runs_apart() -> None:
    runs = [build_scenario(tiny_scenario(runtime={"portable": portable})) for portable in (True, False)]
    with pytest.raises(ScenarioError, match="runtime.portable: the sweep mixes portable and default-mode runs"):
        restart.uniform_portable(runs, "the sweep")


def test_a_cpu_without_avx2_cannot_run_portable(monkeypatch: pytest.MonkeyPatch) -> None:
    from hdcfl_ray.portable import process

    old = {"architecture": "x86_64", "vendor": "GenuineIntel", "model": "Intel Xeon E5-2670", "instruction_sets": ["sse4_2", "avx"]}
    monkeypatch.setattr(process, "cpu_facts", lambda: old)
    problem = process.machine_problem()
    assert problem is not None and "lacks AVX2, FMA" in problem and "set runtime.portable: false" in problem
    monkeypatch.setattr(process, "cpu_facts", lambda: {**old, "architecture": "aarch64"})
    assert "an x86-64 CPU (this one is aarch64)" in str(process.machine_problem())
    with pytest.raises(ScenarioError, match="lacks"):  # validate says so too, before anything runs
        process.portable_notices(RuntimeConfig(portable=True))


def test_ray_workers_get_the_pins_beside_the_variables_plugins_ship() -> None:
    options = {"num_cpus": 1, "runtime_env": {"env_vars": {"HDCFL_RAY_PLUGINS": "my_plugin"}, "py_modules": ["x"]}}
    pinned = with_portable_environment(options, portable=True)
    assert pinned["runtime_env"]["env_vars"] == {"HDCFL_RAY_PLUGINS": "my_plugin", **portable_environment()}
    assert pinned["runtime_env"]["py_modules"] == ["x"] and pinned["num_cpus"] == 1
    assert with_portable_environment(options, portable=False) is options


def test_a_default_mode_manifest_records_the_cpu_and_the_instruction_sets_in_use(tmp_path: Path) -> None:
    import torch

    from hdcfl_ray.runtime.driver import prepare_run, run_simulation

    scenario = tiny_scenario(algorithm={"name": "fedavg"}, runtime={"backend": "local"}, protocol={"rounds": 1})
    run_simulation(prepare_run(build_scenario(scenario)), tmp_path / "run")
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    for record in [manifest["arithmetic"], *(host["arithmetic"] for host in manifest["client_host_hardware"])]:
        assert record["portable"] is False and record["pinned"] is None
        assert record["cpu"]["architecture"] and "instruction_sets" in record["cpu"]
        assert record["in_effect"]["aten"] == torch.backends.cpu.get_cpu_capability()
        assert set(record["started_with"]) <= set(os.environ)


# ---- reports ----
def _manifest(model: str, flags: list[str], portable: bool = False) -> dict:
    record = {"portable": portable, "cpu": {"model": model, "instruction_sets": flags}, "started_with": {}}
    return {"git_revision": "0123456789abcdef", "hardware": {"cpu_model": model}, "packages": {"torch": "2.14.1", "ray": "2.60.0"},
            "arithmetic": record, "client_host_hardware": [{"device": "cpu", "arithmetic": record}]}  # fmt: skip


def _records(methods_on: dict[str, dict]) -> list:
    from analysis.final_metrics import RunMetrics
    from analysis.provenance import run_provenance

    records = []
    for index, (method, manifest) in enumerate(methods_on.items()):
        for seed in (1, 2, 3):
            accuracy = 0.6 + 0.1 * index + 0.01 * seed
            values = {"mean_accuracy": accuracy, "worst_accuracy": accuracy, "bottom20_accuracy": accuracy, "gap": 0.1, "ari_true": math.nan, "num_groups": math.nan}
            records.append(RunMetrics("rot", method, seed, values, run_provenance(manifest)))
    return records


INTEL = _manifest("Intel(R) Xeon(R) Processor", ["avx2", "avx512f", "avx512_bf16", "amx_tile"])
AMD = _manifest("AMD EPYC 9B14", ["avx2", "avx512f", "avx512_bf16"])


def test_a_table_of_default_mode_runs_from_different_machines_says_so_and_marks_their_verdicts() -> None:
    from analysis.paired_table import paired_table
    from analysis.report_tables import all_tables

    records = _records({"fedavg": AMD, "hdcfl": INTEL})
    note = all_tables(records)[0].note
    assert "default: AMD EPYC 9B14 [AVX512-BF16] (3 runs)" in note and "default: Intel(R) Xeon(R) Processor [AMX] (3 runs)" in note
    assert "not bit for bit comparable" in note
    table = paired_table(records)
    assert table is not None and table.rows[0][-1].value == " / ".join(["ahead (arithmetic differs)"] * 3)


def test_runs_of_one_machine_or_all_portable_pair_unmarked() -> None:
    from analysis.paired_table import paired_table
    from analysis.report_tables import all_tables

    for machines in ({"fedavg": INTEL, "hdcfl": INTEL}, {"fedavg": {**AMD, "arithmetic": {**AMD["arithmetic"], "portable": True}, "client_host_hardware": []},
                                                        "hdcfl": {**INTEL, "arithmetic": {**INTEL["arithmetic"], "portable": True}, "client_host_hardware": []}}):  # fmt: skip
        records = _records(machines)
        table = paired_table(records)
        assert table is not None and "arithmetic differs" not in table.rows[0][-1].value
        assert "not bit for bit comparable" not in all_tables(records)[0].note
    assert "Portable arithmetic (the same bits on every machine)." in all_tables(records)[0].note


def test_runs_from_before_the_record_pair_by_their_cpu_name() -> None:
    from analysis.provenance import pairs_bit_for_bit, run_provenance

    old_intel = {key: value for key, value in INTEL.items() if key not in ("arithmetic", "client_host_hardware")}
    assert pairs_bit_for_bit(run_provenance(old_intel), run_provenance(INTEL))
    assert not pairs_bit_for_bit(run_provenance(old_intel), run_provenance(AMD))


def test_portable_runs_pinned_by_an_earlier_version_are_not_paired_with_todays_as_the_same_bits() -> None:
    """The earlier pins took MKL's AVX2 branch (honoured on Intel CPUs only): their
    portable runs have other bits than today's, and a report says so."""
    from analysis.provenance import PORTABLE, arithmetic_label, same_arithmetic

    today = {**INTEL["arithmetic"], "portable": True, "pinned": portable_environment()}
    earlier = {**today, "pinned": {**portable_environment(), "MKL_CBWR": "AVX2,STRICT"}}
    assert arithmetic_label({"arithmetic": today, "client_host_hardware": []}) == PORTABLE
    label = arithmetic_label({"arithmetic": earlier, "client_host_hardware": []})
    assert label == "portable [earlier pins: MKL_CBWR=AVX2,STRICT]"
    assert not same_arithmetic(label, PORTABLE) and same_arithmetic(label, label)
