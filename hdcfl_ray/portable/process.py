"""Whether this process computes with the portable pins, and the refusal when a
portable run would compute elsewhere.

A library reads its variable when it loads or first computes, and keeps what it
read: a process that started without the pins cannot take them on later (setting
os.environ after numpy loaded changes nothing). So a process counts as pinned
only when it started with every pin, and the libraries that can be asked confirm
it. The `hdcfl-ray` command restarts itself with the pins (`restart`); Ray starts
every host actor with them (its runtime_env); a Python session has to be started
with them."""

from __future__ import annotations

from hdcfl_ray.config.schema import RuntimeConfig
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.portable.environment import PORTABLE_LEVEL, portable_environment
from hdcfl_ray.portable.machine import cpu_facts, initial_environment, missing_for_portable

HOW_TO_START = (
    "run it with the hdcfl-ray command, which restarts itself with them, or start Python with them: "
    "env $(python -m hdcfl_ray.portable) python ..."
)


def machine_problem() -> str | None:
    """Why this machine cannot compute at the portable level (None when it can)."""
    cpu = cpu_facts()
    missing = missing_for_portable(cpu)
    if not missing:
        return None
    return (
        f"runtime.portable: true computes at the {PORTABLE_LEVEL} level on every machine, and this machine's CPU "
        f"({cpu['model'] or cpu['vendor'] or 'unknown'}) lacks {', '.join(missing)}, so its bits would differ from "
        "other machines'; set runtime.portable: false (results then hold on this kind of machine only)"
    )


def portable_notices(runtime: RuntimeConfig) -> list[str]:
    """Checks of `runtime.portable` against this machine before anything starts: a
    ScenarioError when the CPU cannot compute at the portable level, and a notice
    when the hosts will use fewer threads than the CPUs they hold."""
    if not runtime.portable:
        return []
    problem = machine_problem()
    if problem is not None:
        raise ScenarioError(problem)
    if runtime.torch_threads == "auto" and runtime.num_cpus_per_actor > 1:
        return [
            f"runtime.portable: each host trains with one torch thread, though runtime.num_cpus_per_actor gives it "
            f"{runtime.num_cpus_per_actor:g} CPUs (more threads would change its sums by the count); lower "
            "runtime.num_cpus_per_actor to run more hosts instead"
        ]
    return []


def unpinned_libraries() -> list[str]:
    """The pins this process does not compute with ([] when it is pinned)."""
    from hdcfl_ray.portable.machine import mkl_reproducibility, numpy_simd, openblas_facts

    expected = portable_environment()
    started_with = initial_environment()
    problems = [
        f"{name}={started_with[name]!r}" if name in started_with else f"{name} unset"
        for name, value in expected.items()
        if started_with.get(name) != value
    ]
    if problems:  # asking ATen now would fix its choice: leave it to the restarted process
        return problems
    import torch

    if torch.backends.cpu.get_cpu_capability() != PORTABLE_LEVEL:
        problems.append(f"ATen computes with {torch.backends.cpu.get_cpu_capability()}")
    mkl = mkl_reproducibility()
    if mkl is not None and mkl != expected["MKL_CBWR"]:
        problems.append(f"MKL's reproducibility branch is {mkl}")
    openblas = openblas_facts()
    if openblas is not None and (str(openblas["core_type"]).lower() != expected["OPENBLAS_CORETYPE"].lower() or openblas["threads"] != 1):
        problems.append(f"OpenBLAS runs {openblas['core_type']} kernels on {openblas['threads']} threads")
    above = set(expected.get("NPY_DISABLE_CPU_FEATURES", "").split(",")) & set(numpy_simd())
    if above:
        problems.append(f"numpy dispatches to {', '.join(sorted(above))}")
    return problems


def pins_not_taken(unpinned: list[str]) -> str:
    """Why a process started with every pin still does not compute with them: a
    library of this build that ignores its variable on this machine. Starting again
    would not help, so the message says what to do instead."""
    cpu = cpu_facts()
    return (
        f"runtime.portable: true, but on this machine ({cpu['model'] or cpu['vendor'] or 'unknown CPU'}) a process started "
        f"with the portable environment still computes elsewhere ({'; '.join(unpinned)}): a math library of this build "
        "ignores its pin here, so this machine cannot give the portable bits; set runtime.portable: false (results then "
        "hold on this kind of machine only) and report the libraries named above with `pip list`"
    )


def require_pinned_process(where: str = "this process") -> None:
    """Raise ScenarioError unless `where` (the driver, a client host) computes with the
    portable pins on a machine that offers them."""
    problem = machine_problem()
    if problem is not None:
        raise ScenarioError(problem)
    unpinned = unpinned_libraries()
    started_with = initial_environment()
    if unpinned and all(started_with.get(name) == value for name, value in portable_environment().items()):
        raise ScenarioError(pins_not_taken(unpinned))  # started pinned: a library ignored its pin
    if unpinned:
        raise ScenarioError(
            f"runtime.portable: true, but {where} did not start with the portable environment ({'; '.join(unpinned)}); "
            f"the libraries fix their instruction sets when they load, so it must be set before the process starts: "
            f"{HOW_TO_START}"
        )
