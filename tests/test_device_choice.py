"""A host's device comes from its grant, never from whether CUDA happens to exist:
checked on a CPU machine by making CUDA look available."""

from __future__ import annotations

import pytest
import torch

from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.runtime.machine_checks import check_runtime
from hdcfl_ray.config.schema import RuntimeConfig
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.runtime.client import device
from hdcfl_ray.runtime.driver import prepare_run
from hdcfl_ray.config.safe_keys import ARITHMETIC_KEYS
from tests.conftest import tiny_scenario


def test_a_host_given_no_gpu_trains_on_cpu_though_cuda_looks_available(monkeypatch: pytest.MonkeyPatch) -> None:
    from hdcfl_ray.runtime.backends.local_host import local_host

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    host = local_host(prepare_run(build_scenario(tiny_scenario(algorithm={"name": "fedavg"}))))
    assert host.device == torch.device("cpu")
    facts = host.hardware()
    assert facts["device"] == "cpu" and facts["gpu_name"] is None and facts["cuda_version"] is None


def test_the_grant_decides_inside_ray_and_the_scenario_outside() -> None:
    share = RuntimeConfig(num_gpus_per_actor=0.25)
    available = lambda: True  # noqa: E731
    # a Ray worker granted nothing (e.g. a donor-swap task that asked for no GPU): CPU, whatever the scenario says
    assert device.choose_device(share, granted=[], cuda_available=available) == torch.device("cpu")
    assert device.choose_device(RuntimeConfig(), granted=["3"], cuda_available=available) == torch.device("cuda", 0)
    # outside Ray (the local backend, ablate): the scenario's share
    assert device.choose_device(share, granted=None, cuda_available=available) == torch.device("cuda", 0)
    assert device.choose_device(RuntimeConfig(), granted=None, cuda_available=available) == torch.device("cpu")


def test_a_granted_gpu_that_cuda_cannot_use_stops_with_the_reason_and_the_fix() -> None:
    with pytest.raises(ScenarioError) as refused:
        device.choose_device(RuntimeConfig(num_gpus_per_actor=0.5), granted=["1"], cuda_available=lambda: False)
    message = str(refused.value)
    assert "runtime.num_gpus_per_actor: 0.5" in message and "Ray granted this host GPU 1" in message
    assert f"built for CUDA {torch.version.cuda or 'none'}" in message
    assert "driver" in message and "num_gpus_per_actor: 0" in message


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a usable GPU")
def test_the_local_backend_refuses_a_gpu_share_without_cuda_before_the_run() -> None:
    scenario = build_scenario(tiny_scenario(runtime={"backend": "local", "num_gpus_per_actor": 0.5}))
    with pytest.raises(ScenarioError, match=r"runtime\.num_gpus_per_actor: 0\.5: the scenario asks for a GPU, but torch cannot use CUDA"):
        check_runtime(scenario.runtime, scenario.partition.num_clients)


def test_a_share_above_one_gpu_is_a_notice_that_the_rest_sits_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    from hdcfl_ray.runtime import machine_checks

    # a cluster not joined yet: its GPUs are counted once connected, so only the notice is left
    monkeypatch.setattr(machine_checks, "ray_placement", lambda runtime: "cluster")
    monkeypatch.setattr(machine_checks, "check_cluster_reachable", lambda address: None)
    notices = check_runtime(RuntimeConfig(backend="ray", num_gpus_per_actor=2.0, address="10.0.0.1:6379"), 4)
    assert any("reserves 2 GPUs per host, but a host trains on one" in notice for notice in notices)
    plain = check_runtime(RuntimeConfig(backend="ray", num_gpus_per_actor=1.0, address="10.0.0.1:6379"), 4)
    assert not any("reserves" in notice for notice in plain)


def test_cpu_hosts_leave_torch_settings_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32)
    device.configure_cuda(RuntimeConfig(cuda_tf32=True, cuda_deterministic=False), torch.device("cpu"))
    after = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32)
    assert after == before


def test_cuda_settings_are_arithmetic_keys() -> None:
    assert {"runtime.cuda_tf32", "runtime.cuda_deterministic"} <= set(ARITHMETIC_KEYS)


@pytest.mark.ray
def test_a_ray_worker_granted_no_gpu_sees_none_and_picks_the_cpu(ray_session: None) -> None:
    import ray

    @ray.remote(num_cpus=0.1)
    def inside_a_worker() -> tuple[list[str] | None, str, str | None]:
        import os

        import torch as worker_torch

        from hdcfl_ray.runtime.client import device as worker_device

        granted = worker_device.granted_gpu_ids()
        chosen = worker_device.choose_device(RuntimeConfig(num_gpus_per_actor=0.25), granted, cuda_available=lambda: True)
        assert worker_torch.device(chosen) == worker_torch.device("cpu")
        return granted, str(chosen), os.environ.get("CUDA_VISIBLE_DEVICES")

    granted, chosen, visible = ray.get(inside_a_worker.remote())
    assert granted == [] and chosen == "cpu"
    assert visible == ""  # Ray hides every GPU from a worker that asked for none
    assert device.granted_gpu_ids() is None  # the driver is not a worker: the scenario decides there
