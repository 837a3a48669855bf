"""A scenario against the machine it runs on, checked before a run directory
exists or Ray starts: GPU shares and actor slots against the GPUs and CPUs
there are, the memory the data and the models need, and the dashboard extra.

What "the machine" is depends on where the run will live: the Ray instance this
process already holds (a sweep, a test session), the private instance a run
with `runtime.address: null` would start (sized the way Ray would size it,
without starting it), or this process for the local backend. A cluster joined
through `runtime.address` can only be measured once connected; the simulation
checks it then, still before the run directory is created.

Every check raises ScenarioError naming the key and the fix; things that are
not errors but change what a run does come back as notices.
"""

from __future__ import annotations

import ipaddress
import math
import os
import socket
import sys
from dataclasses import dataclass
from typing import Literal

from hdcfl_ray.config.schema import AlgorithmConfig, DatasetConfig, ModelConfig, RuntimeConfig
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.host_memory import machine_memory_bytes

# Ray keeps resource quantities to four decimals; a smaller share is refused by Ray itself.
RESOURCE_PRECISION = 1e-4
# A client host actor is a Python process with torch loaded: about half a gigabyte.
HOST_ACTOR_BYTES = 512 * 2**20
# Training needs an encoder at least four times: the server's copy, the host's working
# copy, its gradients and its optimiser state (momentum), before any algorithm's extras.
ENCODER_COPIES = 4
GIB = 2**30
# seconds to wait for a TCP answer from a cluster address before calling it unreachable
REACH_TIMEOUT_S = 5.0


# where a Ray run's actors go: the Ray this process already holds, a cluster named by
# runtime.address and not joined yet, or a private instance the run starts
Placement = Literal["joined", "cluster", "private"]


@dataclass(frozen=True)
class Capacity:
    """CPUs and GPUs a run can place actors on, and where they were counted."""

    cpus: float
    gpus: float
    where: str


def check_runtime(runtime: RuntimeConfig, num_clients: int) -> list[str]:
    """Everything about `runtime.*` that can be checked before Ray starts; returns notices."""
    from hdcfl_ray.portable.process import portable_notices
    from hdcfl_ray.runtime.backends.choice import choose_backend

    _check_resource_shares(runtime)
    share_notices = [*portable_notices(runtime), *_gpu_share_notices(runtime), *_emulated_precision_notices(runtime)]
    if choose_backend(runtime) == "local":
        return [*share_notices, *_check_local_backend(runtime)]
    where = ray_placement(runtime)
    notices = [*share_notices, *_dashboard_notices(runtime, where)]
    if where == "private":
        _check_dashboard(runtime)
    capacity = planned_capacity(runtime, where)
    if capacity is None:  # a cluster not joined yet: measured once connected (driver.run_simulation)
        check_cluster_reachable(str(runtime.address))
        return [
            *notices,
            f"runtime.address: the CPUs and GPUs of the cluster at {runtime.address!r} are checked against the actors "
            "when simulate joins it, before the run directory is created",
        ]
    hosts = planned_hosts(runtime, num_clients, capacity)
    if where == "private":
        _check_host_memory(hosts)
    check_actor_capacity(runtime, hosts, capacity)
    return notices


def ray_placement(runtime: RuntimeConfig) -> Placement:
    ray = sys.modules.get("ray")  # not imported to ask: a process that never imported it holds none
    if ray is not None and ray.is_initialized():
        return "joined"
    return "private" if runtime.address is None else "cluster"


def planned_capacity(runtime: RuntimeConfig, where: Placement) -> Capacity | None:
    if where == "joined":
        import ray

        resources = ray.cluster_resources()
        return Capacity(float(resources.get("CPU", 0.0)), float(resources.get("GPU", 0.0)), "the Ray cluster this process is connected to")
    if where == "private":
        return private_ray_capacity(runtime)
    return None


def _check_local_backend(runtime: RuntimeConfig) -> list[str]:
    from hdcfl_ray.runtime.backends.choice import local_cpus

    machine_cpus = os.cpu_count() or 1
    if local_cpus(runtime) > machine_cpus:
        raise ScenarioError(
            f"runtime.num_cpus: {runtime.num_cpus} is more than the {machine_cpus} CPUs of this machine; the local "
            f"backend trains with that many torch threads (choose 1..{machine_cpus}, or null for all)"
        )
    notices = []
    if runtime.num_gpus_per_actor > 0:
        # the local backend's hosts train on the GPU the scenario asks for: refuse now
        # (same message as the host's) if there is none to use, before any data loads
        from hdcfl_ray.runtime.client.device import choose_device

        choose_device(runtime)
        from hdcfl_ray.config.runtime_resolved import trains_batched

        share = runtime.num_gpus_per_actor
        if share < 1 and trains_batched(runtime):
            hosts_per_gpu = max(1, int(round(1.0 / share, 6)))
            notices.append(
                f"runtime.num_gpus_per_actor: {share:g} puts {hosts_per_gpu} hosts on each GPU, so a round's participants "
                f"on a GPU train in {hosts_per_gpu} batches instead of one; use 1 (one host per GPU, holding all its "
                "clients) unless the clients' models do not fit one GPU together"
            )
    if runtime.include_dashboard:
        notices.append("runtime.include_dashboard: the local backend starts no Ray, so there is no dashboard; set runtime.backend: ray")
    return notices


def _dashboard_notices(runtime: RuntimeConfig, where: Placement) -> list[str]:
    if not runtime.include_dashboard or where == "private":
        return []
    if where == "joined":
        return ["runtime.include_dashboard: this process already runs Ray and the run joins it, with the dashboard that instance was started with"]
    return [
        "runtime.include_dashboard: a joined cluster has the dashboard its head node was started with "
        "(ray start --head --include-dashboard=true); this key applies to a private Ray instance only"
    ]


def check_cluster_reachable(address: str) -> None:
    """A `host:port` with nothing listening would keep ray.init retrying for minutes:
    try one TCP connection first ("auto" and ray:// addresses are left to Ray)."""
    host, separator, port = address.rpartition(":")
    if not separator or not port.isdigit() or "://" in address or not host:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=REACH_TIMEOUT_S).close()
    except OSError as error:
        raise ScenarioError(
            f"runtime.address: nothing answers at {address} ({error.strerror or error}); start the cluster's head "
            "there (ray start --head --port=...), or set runtime.address: null for a private instance"
        ) from None


def planned_hosts(runtime: RuntimeConfig, num_clients: int, capacity: Capacity) -> int:
    from hdcfl_ray.runtime.backends.placement import count_hosts

    return count_hosts(runtime, num_clients, capacity.cpus, capacity.gpus)


def check_actor_capacity(runtime: RuntimeConfig, num_hosts: int, capacity: Capacity) -> None:
    """Actors that cannot all be placed would wait forever: refuse up front."""
    needed_cpus = num_hosts * runtime.num_cpus_per_actor
    if needed_cpus > capacity.cpus + 1e-9:
        raise ScenarioError(
            f"runtime: {num_hosts} client host actors x runtime.num_cpus_per_actor = {runtime.num_cpus_per_actor:g} "
            f"need {needed_cpus:g} CPUs but {capacity.where} has {capacity.cpus:g}; set runtime.clients_per_actor: auto, "
            f"raise it, set runtime.max_actors, or lower runtime.num_cpus_per_actor"
        )
    needed_gpus = num_hosts * runtime.num_gpus_per_actor
    if needed_gpus > capacity.gpus + 1e-9:
        raise ScenarioError(
            f"runtime.num_gpus_per_actor: {runtime.num_gpus_per_actor:g} x {num_hosts} actors needs {needed_gpus:g} GPUs "
            f"but {capacity.where} has {capacity.gpus:g}; set runtime.num_gpus_per_actor: 0 to train on CPU"
        )


def _check_host_memory(num_hosts: int) -> None:
    memory = machine_memory_bytes()
    if memory is not None and num_hosts * HOST_ACTOR_BYTES > memory:
        raise ScenarioError(
            f"runtime: {num_hosts} client host actors need about {num_hosts * HOST_ACTOR_BYTES / GIB:.0f} GiB "
            f"({HOST_ACTOR_BYTES / GIB:.1f} GiB each) but this machine has {memory / GIB:.0f} GiB; raise "
            f"runtime.clients_per_actor (or use auto), or set runtime.max_actors"
        )


def private_ray_capacity(runtime: RuntimeConfig) -> Capacity:
    """The CPUs and GPUs a private Ray instance would have, found the way Ray finds
    them (cgroup limits, CUDA_VISIBLE_DEVICES, RAY_OVERRIDE_RESOURCES), without starting it."""
    where = "the private Ray instance of this machine"
    try:
        from ray._private.resource_and_label_spec import ResourceAndLabelSpec

        spec = ResourceAndLabelSpec(num_cpus=runtime.num_cpus).resolve(is_head=True, node_ip_address="127.0.0.1")
        return Capacity(float(spec.num_cpus or 0), float(spec.num_gpus or 0), where)
    except Exception:  # a Ray without this internal: count as torch and the OS do
        import torch

        return Capacity(float(runtime.num_cpus or os.cpu_count() or 1), float(torch.cuda.device_count()), where)


def _check_resource_shares(runtime: RuntimeConfig) -> None:
    for key, share in (("num_cpus_per_actor", runtime.num_cpus_per_actor), ("num_gpus_per_actor", runtime.num_gpus_per_actor)):
        if 0 < share < RESOURCE_PRECISION:
            raise ScenarioError(f"runtime.{key}: {share:g} is below Ray's smallest share, {RESOURCE_PRECISION:g}")
    share = runtime.num_gpus_per_actor
    if share > 1 and not float(share).is_integer():
        raise ScenarioError(
            f"runtime.num_gpus_per_actor: {share:g}: a share above one GPU must be a whole number "
            "(Ray splits single GPUs only); use a fraction such as 0.5 or a whole number"
        )


def _gpu_share_notices(runtime: RuntimeConfig) -> list[str]:
    share = runtime.num_gpus_per_actor
    if share <= 1:
        return []
    return [
        f"runtime.num_gpus_per_actor: {share:g} reserves {share:g} GPUs per host, but a host trains on one of "
        f"them; the other {share - 1:g} sit idle. Use 1 (or a fraction) and more hosts to use more GPUs"
    ]


# measured (docs/benchmarks.md, "bfloat16 without native support"): the CIFAR-10 small-CNN
# workload in bf16 against fp32 on an AVX2-only EPYC (13.7x) and on an EPYC capped to AVX2 (23.8x)
EMULATED_BF16_SLOWDOWN = "14 to 24 times"


def _emulated_precision_notices(runtime: RuntimeConfig) -> list[str]:
    """An explicit bf16 on CPU hosts where oneDNN will emulate bfloat16: a CPU with
    neither AVX512-BF16 nor AMX, or one whose bfloat16 instructions an instruction-set
    cap in the hosts' environment (ONEDNN_MAX_CPU_ISA=AVX2, as in a process started
    with the portable pins) keeps oneDNN from. Emulated bfloat16 is far slower than float32; `auto` already picks
    fp32 there, and a user who asked for bf16 is told the cost."""
    from hdcfl_ray.portable.machine import cpu_facts
    from hdcfl_ray.training.precision import bf16_arithmetic, onednn_cap

    # a portable run's hosts compute in float32 whatever it asks (the schema refuses bf16 there)
    if runtime.precision != "bf16" or runtime.num_gpus_per_actor > 0 or runtime.portable:
        return []
    cpu = cpu_facts()
    flags = cpu["instruction_sets"]
    environment = _hosts_environment()
    if cpu["architecture"] not in ("x86_64", "AMD64") or bf16_arithmetic(flags, environment) != "emulated":
        return []
    name = cpu["model"] or cpu["vendor"] or "unknown"
    cost = (
        f"its bfloat16 arithmetic is emulated, and a compute-bound CIFAR-10 workload ran {EMULATED_BF16_SLOWDOWN} "
        "slower than in fp32 on such machines (docs/benchmarks.md)"
    )
    cap = onednn_cap(environment)
    if cap is not None and bf16_arithmetic(flags, {}) != "emulated":
        variable, value = cap
        return [
            f"runtime.precision: bf16 with {variable}={value} in the environment the hosts start with: oneDNN computes "
            f"with {value} at most, without the bfloat16 instructions of this CPU ({name}), so {cost}; use "
            f"runtime.precision: fp32 (or auto, fp32 under this cap), or unset {variable} or raise it to AVX512_CORE_BF16 or above"
        ]
    return [
        f"runtime.precision: bf16 on this CPU ({name}), which has neither AVX512-BF16 nor AMX: {cost}; use "
        "runtime.precision: fp32, or auto (fp32 on this CPU)"
    ]


def _hosts_environment() -> dict[str, str]:
    """The environment the client hosts start with, where oneDNN reads its cap: this
    process's own. The local backend's hosts are this process; Ray's workers inherit
    it from the process that started Ray, which is this one for a private instance
    and for the one a test session or a sweep holds. The nodes of a cluster joined
    through runtime.address run with their own `ray start` environment, which is not
    asked (its CPUs are not either)."""
    return dict(os.environ)


def _check_dashboard(runtime: RuntimeConfig) -> None:
    if not runtime.include_dashboard:
        return
    if not is_loopback_host(runtime.dashboard_host):
        raise ScenarioError(
            f"runtime.dashboard_host: {runtime.dashboard_host!r} is not a loopback address; a private Ray instance "
            "listens on this machine only (127.0.0.1). To serve a dashboard elsewhere, start a cluster with "
            "ray start --head --dashboard-host=... and join it with runtime.address"
        )
    try:
        import ray.dashboard.optional_deps  # noqa: F401  (what Ray imports to decide the same)
    except ImportError as error:
        raise ScenarioError(
            f"runtime.include_dashboard: true needs the dashboard extra, which is not installed ({error}); "
            'install it with pip install -e ".[dashboard]" (ray[default]), or set runtime.include_dashboard: false'
        ) from None


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def check_synthetic_memory(dataset: DatasetConfig) -> None:
    """The synthetic source draws its images in memory (float32 while drawing): refuse
    sizes this machine cannot hold before drawing them."""
    if dataset.name != "synthetic":
        return
    memory = machine_memory_bytes()
    if memory is None:
        return
    pixels = dataset.image_size**2 * dataset.channels
    # prototypes (two float32 copies per class), then per split noise, sum and rounding in float32
    needed = pixels * (8 * dataset.num_classes + 13 * max(dataset.train_samples, dataset.test_samples) + dataset.train_samples + dataset.test_samples)
    if needed > memory:
        raise ScenarioError(
            f"dataset: the synthetic images (dataset.train_samples {dataset.train_samples}, test_samples "
            f"{dataset.test_samples}, image_size {dataset.image_size}, channels {dataset.channels}, num_classes "
            f"{dataset.num_classes}) need about {needed / GIB:.3g} GiB while they are drawn, more than this machine's "
            f"{memory / GIB:.0f} GiB; lower them"
        )




def check_model_memory(model: ModelConfig, in_channels: int, algorithm: AlgorithmConfig) -> None:
    """Count the encoder's parameters without allocating them (torch's meta device) and
    refuse an encoder this machine cannot train, with the method's own further models."""
    # the key that sets how many full models the method keeps besides the shared one
    # (cluster models, centres), declared by the method (MethodSpec.extra_models)
    from hdcfl_ray.algorithms.registry import method_spec
    from hdcfl_ray.config.schema import method_params
    from hdcfl_ray.contract import AUTO

    spec = method_spec(algorithm.name)
    section, field = algorithm.name, spec.extra_models
    count = getattr(method_params(algorithm), field) if field else 0
    if count == AUTO:  # chosen when the run starts: count the most its candidates keep
        from hdcfl_ray.auto_knobs.plan import largest_candidate

        count = largest_candidate(spec, method_params(algorithm), field)
    extra_models = int(count)
    extra_models_key = f"algorithm.{section}.{field}"
    memory = machine_memory_bytes()
    if memory is None:
        return
    import torch

    from hdcfl_ray.models.encoders import build_encoder

    sizes = f"model.encoder {model.encoder}, model.width {model.width}, model.feature_dim {model.feature_dim}"
    try:
        with torch.device("meta"):
            encoder = build_encoder(model, in_channels)
        parameters = sum(parameter.numel() for parameter in encoder.parameters())
    except (RuntimeError, OverflowError, ValueError):  # a size past what torch can even describe
        parameters = math.inf
    copies = ENCODER_COPIES + extra_models
    needed = 4 * parameters * copies
    if needed > memory:
        extra = f" and {extra_models} from {extra_models_key}" if extra_models else ""
        shown = "more than torch can hold" if math.isinf(parameters) else f"{parameters:,} parameters"
        raise ScenarioError(
            f"model: the encoder ({sizes}) has {shown}; {copies} copies ({ENCODER_COPIES} for training{extra}) "
            f"need more than this machine's {memory / GIB:.0f} GiB; lower model.width or model.feature_dim"
            + (f", or {extra_models_key}" if extra else "")
        )
