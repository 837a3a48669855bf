"""runtime.precision and runtime.channels_last: mixed precision runs the hooks' forward
passes under autocast with float32 weights, is reproducible, records what it resolved
to, and refuses float16 without a GPU; NHWC layout keeps the flat vectors' order."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.config.schema import ModelConfig
from hdcfl_ray.contract import OptimizerConfig
from hdcfl_ray.models import build_split_model, flatten_module, load_flat_into
from hdcfl_ray.runtime.backends.local_host import in_process_run
from hdcfl_ray.training import precision
from hdcfl_ray.training.local_training import train_locally
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.terminal.live_view import QuietObserver
from tests.conftest import tiny_scenario


def final_global(runtime: dict) -> np.ndarray:
    scenario = build_scenario(tiny_scenario(algorithm={"name": "fedavg"}, runtime=runtime, protocol={"rounds": 2}))
    run = in_process_run(prepare_run(scenario))
    run.run_all()
    model = run.server.state.model
    return np.concatenate([model.encoder, model.head])


def test_bf16_autocast_trains_reproducibly_with_float32_weights_and_changes_the_arithmetic() -> None:
    fp32 = final_global({"precision": "fp32"})
    bf16 = final_global({"precision": "bf16"})
    assert np.array_equal(fp32, final_global({}))  # fp32 is the default, the same bits
    assert np.array_equal(fp32, final_global({"precision": "fp32"}))  # and bit-stable run to run
    assert bf16.dtype == np.float32 and np.isfinite(bf16).all()
    assert np.array_equal(bf16, final_global({"precision": "bf16"}))  # same bits twice
    assert not np.array_equal(bf16, fp32)  # autocast was on
    # bfloat16 products, float32 accumulation: the trained weights stay close
    assert np.linalg.norm(bf16 - fp32) < 0.05 * np.linalg.norm(fp32)


def test_fp16_without_a_gpu_share_is_refused_before_anything_runs() -> None:
    from hdcfl_ray.errors import ScenarioError

    with pytest.raises(ScenarioError, match=r"runtime\.precision: fp16 runs on GPUs only.*num_gpus_per_actor: 0.*bf16"):
        build_scenario(tiny_scenario(runtime={"precision": "fp16"}))


def test_a_host_without_cuda_refuses_fp16_with_the_key_and_the_alternative() -> None:
    """The host's own check, for settings that skipped the scenario's validation."""
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: fp16 is allowed")
    from hdcfl_ray.runtime.backends.local_host import local_host

    prepared = prepare_run(build_scenario(tiny_scenario(algorithm={"name": "fedavg"})))
    runtime = prepared.scenario.runtime.model_copy(update={"precision": "fp16"})
    prepared = type(prepared)(scenario=prepared.scenario.model_copy(update={"runtime": runtime}), dataset=prepared.dataset, partition=prepared.partition)
    with pytest.raises(ValueError, match=r"runtime\.precision: fp16 needs a CUDA device.*bf16"):
        local_host(prepared)


@pytest.mark.parametrize(
    ("vendor", "amx", "avx512_bf16", "expected"),
    [
        ("GenuineIntel", True, True, "bf16"),  # AMX tiles
        ("GenuineIntel", False, True, "fp32"),  # AVX512-BF16 without AMX: measured slower
        ("AuthenticAMD", False, True, "bf16"),  # AVX512-BF16 on AMD: measured faster
        ("AuthenticAMD", False, False, "fp32"),
        ("", False, False, "fp32"),
    ],
)
def test_auto_picks_bf16_only_where_it_was_measured_faster(
    monkeypatch: pytest.MonkeyPatch, vendor: str, amx: bool, avx512_bf16: bool, expected: str
) -> None:
    cpu = torch.device("cpu")
    _pretend_cpu(monkeypatch, vendor, amx, avx512_bf16)
    assert precision.resolve_precision("auto", cpu) == expected
    assert precision.resolve_precision("fp32", cpu) == "fp32"


def _pretend_cpu(monkeypatch: pytest.MonkeyPatch, vendor: str, amx: bool, avx512_bf16: bool, **environment: str) -> None:
    """torch's probes answer for this CPU, and the process's environment holds exactly
    these oneDNN caps (none of the machine's own)."""
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(precision, "cpu_vendor", lambda: vendor)
    for variable in precision.ONEDNN_CAP_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    for variable, value in environment.items():
        monkeypatch.setenv(variable, value)


@pytest.mark.parametrize(
    ("vendor", "amx", "environment", "expected"),
    [
        ("GenuineIntel", True, {"ONEDNN_MAX_CPU_ISA": "AVX2"}, "fp32"),  # AMX capped away: emulated
        ("GenuineIntel", True, {"DNNL_MAX_CPU_ISA": "avx512_core"}, "fp32"),  # the older name, any case
        ("GenuineIntel", True, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, "fp32"),  # AVX512-BF16 without AMX: slower on Intel
        ("GenuineIntel", True, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, "bf16"),
        ("GenuineIntel", True, {"ONEDNN_MAX_CPU_ISA": "DEFAULT"}, "bf16"),
        ("AuthenticAMD", False, {"ONEDNN_MAX_CPU_ISA": "AVX2"}, "fp32"),
        ("AuthenticAMD", False, {"ONEDNN_MAX_CPU_ISA": "AVX2_VNNI_2"}, "fp32"),  # bfloat16 conversions only
        ("AuthenticAMD", False, {"ONEDNN_MAX_CPU_ISA": "AVX10_1_512"}, "bf16"),
        # ONEDNN_ wins over DNNL_, as oneDNN reads them
        ("AuthenticAMD", False, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16", "DNNL_MAX_CPU_ISA": "AVX2"}, "bf16"),
    ],
)
def test_auto_reads_what_onednn_will_use_under_its_instruction_set_cap(
    monkeypatch: pytest.MonkeyPatch, vendor: str, amx: bool, environment: dict[str, str], expected: str
) -> None:
    _pretend_cpu(monkeypatch, vendor, amx, True, **environment)
    assert precision.resolve_precision("auto", torch.device("cpu")) == expected


def test_auto_picks_fp32_in_a_process_started_with_the_portable_pins(monkeypatch: pytest.MonkeyPatch) -> None:
    from hdcfl_ray.portable.environment import portable_environment

    _pretend_cpu(monkeypatch, "GenuineIntel", True, True, **portable_environment())
    assert precision.resolve_precision("auto", torch.device("cpu")) == "fp32"
    assert precision.bf16_arithmetic({"avx512_bf16", "amx_tile"}, portable_environment()) == "emulated"


@pytest.mark.parametrize(
    ("cpu_flags", "environment", "arithmetic"),
    [
        ({"avx2"}, {}, "emulated"),
        ({"avx2"}, {"ONEDNN_MAX_CPU_ISA": "AVX10_1_512_AMX"}, "emulated"),  # a cap adds nothing the CPU lacks
        ({"avx512_bf16"}, {}, "avx512_bf16"),
        ({"avx512_bf16", "amx_tile"}, {"ONEDNN_MAX_CPU_ISA": "AVX10_1_512"}, "avx512_bf16"),
        ({"avx512_bf16", "amx_tile"}, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI"}, "emulated"),
        ({"avx512_bf16", "amx_tile"}, {"ONEDNN_MAX_CPU_ISA": "no such isa"}, "amx"),  # oneDNN ignores it
        ({"avx512_bf16", "amx_tile"}, {"ONEDNN_MAX_CPU_ISA": " ", "DNNL_MAX_CPU_ISA": "AVX"}, "emulated"),  # blank counts as unset
    ],
)
def test_bf16_arithmetic_is_the_lower_of_the_cpu_and_the_cap(cpu_flags: set[str], environment: dict[str, str], arithmetic: str) -> None:
    assert precision.bf16_arithmetic(cpu_flags, environment) == arithmetic


def test_auto_keeps_float32_on_cuda_where_bf16_was_measured_no_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    # an H200 trained this project's models at 1.01x (ResNet-18) and 0.74x (small CNN) fp32's rate
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert precision.resolve_precision("auto", torch.device("cuda", 0)) == "fp32"
    assert precision.resolve_precision("bf16", torch.device("cuda", 0)) == "bf16"


def test_the_manifest_records_each_hosts_device_precision_threads_and_layout(tmp_path: Path) -> None:
    scenario = build_scenario(
        tiny_scenario(
            algorithm={"name": "fedavg"},
            runtime={"backend": "local", "precision": "bf16", "channels_last": True, "torch_threads": 1},
            protocol={"rounds": 1},
        )
    )
    run_simulation(prepare_run(scenario), tmp_path / "run", observer=QuietObserver())
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    hosts = manifest["client_host_hardware"]
    assert len(hosts) == manifest["num_client_hosts"] >= 1
    expected = {"device": "cpu", "precision": "bf16", "torch_threads": 1, "channels_last": True}
    assert all({key: host[key] for key in expected} == expected for host in hosts)
    # a CPU host has no GPU facts, and outside Ray no grant
    assert all(host["gpu_name"] is None and host["cuda_version"] is None and host["granted_gpu_ids"] is None for host in hosts)
    assert manifest["runtime"]["torch_threads_per_host"] == 1


def test_channels_last_keeps_the_flat_vectors_logical_order() -> None:
    config = ModelConfig(encoder="small_cnn", width=8, feature_dim=16)
    plain = build_split_model(config, in_channels=3, num_classes=4, seed=3)
    nhwc = build_split_model(config, in_channels=3, num_classes=4, seed=3)
    nhwc.encoder.to(memory_format=torch.channels_last)
    assert np.array_equal(flatten_module(plain.encoder), flatten_module(nhwc.encoder))
    vector = np.random.default_rng(0).standard_normal(flatten_module(plain.encoder).shape[0]).astype(np.float32)
    load_flat_into(plain.encoder, vector)
    load_flat_into(nhwc.encoder, vector)
    inputs = torch.randn(5, 3, 16, 16)
    plain.encoder.eval()
    nhwc.encoder.eval()
    with torch.no_grad():
        assert torch.allclose(plain.encoder(inputs), nhwc.encoder(inputs.contiguous(memory_format=torch.channels_last)), atol=1e-5)


def test_loss_scaler_skips_an_overflowing_step_and_halves_its_scale() -> None:
    parameter = torch.nn.Parameter(torch.ones(3))
    scaler = precision.LossScaler(scale=8.0, growth_interval=2)
    parameter.grad = torch.tensor([8.0, 16.0, 24.0])
    assert scaler.unscale_and_check([parameter]) and torch.equal(parameter.grad, torch.tensor([1.0, 2.0, 3.0]))
    parameter.grad = torch.tensor([float("inf"), 0.0, 0.0])
    assert not scaler.unscale_and_check([parameter]) and scaler.scale == 4.0
    for _ in range(2):
        parameter.grad = torch.zeros(3)
        scaler.unscale_and_check([parameter])
    assert scaler.scale == 8.0  # two clean steps double it again


def test_float16_training_scales_the_loss_and_still_learns() -> None:
    """The fp16 path of train_locally (on CPU only here, where it is slow but correct)."""
    torch.manual_seed(0)
    config = ModelConfig(encoder="small_cnn", width=4, feature_dim=8)
    model = build_split_model(config, in_channels=1, num_classes=2, seed=0)
    inputs = torch.randn(64, 1, 8, 8)
    labels = (inputs.mean(dim=(1, 2, 3)) > 0).long()
    generator = torch.Generator().manual_seed(0)
    optimizer = OptimizerConfig(name="sgd", lr=0.5, momentum=0.0, weight_decay=0.0)
    with precision.autocast("fp16", torch.device("cpu")):  # one context over many steps, as a host runs it
        first = train_locally(model, inputs, labels, epochs=1, batch_size=16, optimizer_config=optimizer, generator=generator)
        for _ in range(10):
            last = train_locally(model, inputs, labels, epochs=1, batch_size=16, optimizer_config=optimizer, generator=generator)
    assert np.isfinite(last.mean_loss) and last.mean_loss < first.mean_loss
    assert all(p.dtype == torch.float32 for p in model.encoder.parameters())


@pytest.mark.parametrize(
    ("instruction_sets", "runtime", "told"),
    [
        (["avx2", "fma"], {"precision": "bf16"}, True),  # an AVX2 EPYC: emulated
        (["avx2", "fma", "avx512f", "avx512_bf16"], {"precision": "bf16"}, False),
        (["avx2", "fma", "avx512f", "amx_tile", "amx_bf16"], {"precision": "bf16"}, False),
        (["avx2", "fma"], {"precision": "auto"}, False),  # auto picks fp32 there itself
        (["avx2", "fma"], {"precision": "fp32"}, False),
        (["avx2", "fma"], {"precision": "bf16", "num_gpus_per_actor": 1, "backend": "ray"}, False),  # hosts on CUDA
    ],
)
def test_bf16_on_a_cpu_that_emulates_it_is_named_at_start_with_the_alternative(
    monkeypatch: pytest.MonkeyPatch, instruction_sets: list[str], runtime: dict, told: bool
) -> None:
    from hdcfl_ray.runtime import machine_checks
    from hdcfl_ray.portable import machine

    cpu = {"architecture": "x86_64", "vendor": "AuthenticAMD", "model": "AMD EPYC 7B13", "instruction_sets": instruction_sets}
    monkeypatch.setattr(machine, "cpu_facts", lambda: cpu)
    for variable in precision.ONEDNN_CAP_VARIABLES:  # no cap from this machine's environment
        monkeypatch.delenv(variable, raising=False)
    notices = machine_checks._emulated_precision_notices(build_scenario(tiny_scenario(runtime=runtime)).runtime)
    if not told:
        assert notices == []
        return
    (notice,) = notices
    assert "AMD EPYC 7B13" in notice and "neither AVX512-BF16 nor AMX" in notice
    assert "slower than in fp32" in notice and "runtime.precision: fp32, or auto" in notice
    assert "PLACEHOLDER" not in notice


INTEL_AMX = ["avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"]


@pytest.mark.parametrize(
    ("instruction_sets", "environment", "named"),
    [
        (INTEL_AMX, {}, None),  # no cap on a bfloat16 CPU: nothing to say
        (INTEL_AMX, {"ONEDNN_MAX_CPU_ISA": "AVX2"}, "ONEDNN_MAX_CPU_ISA=AVX2"),
        (INTEL_AMX, {"DNNL_MAX_CPU_ISA": "avx512_core_vnni"}, "DNNL_MAX_CPU_ISA=avx512_core_vnni"),
        (INTEL_AMX, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, None),  # AVX512-BF16 is native bfloat16
        (INTEL_AMX, {"ONEDNN_MAX_CPU_ISA": "AVX2_VNNI_2"}, "ONEDNN_MAX_CPU_ISA=AVX2_VNNI_2"),  # conversions only
        (["avx2", "fma"], {}, "neither AVX512-BF16 nor AMX"),  # an AVX2-only CPU
        (["avx2", "fma"], {"ONEDNN_MAX_CPU_ISA": "AVX2"}, "neither AVX512-BF16 nor AMX"),  # the CPU is the reason, not the cap
        (INTEL_AMX, "portable pins", "ONEDNN_MAX_CPU_ISA=AVX2"),  # a process started pinned (runtime.portable off)
    ],
)
def test_bf16_under_an_instruction_set_cap_is_named_as_emulated_with_the_cap(
    monkeypatch: pytest.MonkeyPatch, instruction_sets: list[str], environment: dict[str, str] | str, named: str | None
) -> None:
    from hdcfl_ray.portable import machine
    from hdcfl_ray.portable.environment import portable_environment
    from hdcfl_ray.runtime import machine_checks

    cpu = {"architecture": "x86_64", "vendor": "GenuineIntel", "model": "Intel(R) Xeon(R) Platinum 8481C", "instruction_sets": instruction_sets}
    monkeypatch.setattr(machine, "cpu_facts", lambda: cpu)
    for variable in precision.ONEDNN_CAP_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    for variable, value in (portable_environment() if environment == "portable pins" else environment).items():
        monkeypatch.setenv(variable, value)
    notices = machine_checks._emulated_precision_notices(build_scenario(tiny_scenario(runtime={"precision": "bf16"})).runtime)
    if named is None:
        assert notices == []
        return
    (notice,) = notices
    assert named in notice and "emulated" in notice and "slower than in fp32" in notice
    if named.startswith(precision.ONEDNN_CAP_VARIABLES):
        variable = named.split("=")[0]
        assert f"unset {variable} or raise it to AVX512_CORE_BF16" in notice and "Xeon(R) Platinum 8481C" in notice
