"""The reference runs whose per-client numbers are pinned bit for bit in
tests/golden/: a shortened quickstart (digits, rotation, seed 42) per method.

Bits are a property of the code and of the CPU's arithmetic: MKL and oneDNN pick
their kernels by CPU vendor and instruction set, so an Intel and an AMD machine
with the same code round differently in the 7th digit. There is one golden file
per arithmetic (`arithmetic_key()`, e.g. GenuineIntel-AVX512). `python -m
tests.bit_reference` writes this machine's file: for a new kind of machine, from
code whose bits are pinned elsewhere, or for a change meant to alter results
(rewrite every machine's file then, and say so in the commit).

Portable runs (`runtime.portable: true`) compute the same bits on every machine, so
they have one file for all (`PORTABLE_GOLDEN`): `python -m tests.bit_reference
--portable` writes it (the command restarts itself with the portable environment),
and a machine whose portable bits differ from it shows a library the pins missed."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

GOLDEN_DIR = Path(__file__).parent / "golden"
GOLDEN_STEM = "quickstart-seed42-3rounds"
QUICKSTART = Path(__file__).parents[1] / "scenarios" / "quickstart.yaml"
COLUMNS = ("round", "client_id", "accuracy", "loss", "train_loss")
# short, but long enough for every method's server-side step: HDC-FL refreshes
# from round 1, FedSoft re-estimates importance, FedBABU fine-tunes at the end
OVERRIDES = {
    "protocol.rounds": 3,
    "protocol.participation": 0.5,
    "algorithm.hdcfl.activation_round": 1,
    "algorithm.hdcfl.refresh_every": 1,
    # Ditto's single-lambda mode, the Ditto the files were recorded with; per-client lambda (the
    # default) is its trainings on a held-out split, held to this mode in test_algorithm_ditto.py
    "algorithm.ditto.lambda_selection": "fixed",
    # the values the files were recorded with (the methods' defaults); the quickstart's own are calibrated
    # (docs/calibration.md)
    "algorithm.hdcfl.groups": 4,
    "algorithm.ifca.clusters": 4,
    "algorithm.fedsoft.centers": 3,
    "algorithm.fedce.temperature": 4.0,
    "runtime.backend": "local",
}


def arithmetic_key() -> str:
    """The CPU vendor and torch's vector instruction set, e.g. AuthenticAMD-AVX512:
    what decides which kernels, and so which roundings, a CPU run gets."""
    import platform

    import torch

    vendor = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            vendor = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("vendor_id")), vendor)
    except OSError:
        pass
    return f"{vendor}-{torch.backends.cpu.get_cpu_capability()}"


PORTABLE_GOLDEN = GOLDEN_DIR / f"{GOLDEN_STEM}-portable.json"


def golden_path(key: str) -> Path:
    return GOLDEN_DIR / f"{GOLDEN_STEM}.{key}.json"


def golden_files() -> dict[str, Path]:
    """Every recorded arithmetic and its file."""
    return {path.name[len(GOLDEN_STEM) + 1 : -len(".json")]: path for path in sorted(GOLDEN_DIR.glob(f"{GOLDEN_STEM}.*.json"))}


def _exact(value: object) -> object:
    return float(value).hex() if isinstance(value, float) else value


def quickstart_rows(method: str, run_dir: Path, portable: bool = False) -> list[list[object]]:
    """(round, client, accuracy, loss, train_loss) of every scored client, floats as hex;
    `portable` needs a process started with the portable environment."""
    import yaml

    from hdcfl_ray.config.loading import build_scenario
    from hdcfl_ray.logs.table_writer import read_table
    from hdcfl_ray.runtime.driver import prepare_run, run_simulation
    from hdcfl_ray.terminal.live_view import QuietObserver

    raw = yaml.safe_load(QUICKSTART.read_text())
    raw["algorithm"]["name"] = method
    for dotted, value in {**OVERRIDES, "runtime.portable": portable}.items():
        section, _, key = dotted.rpartition(".")
        node = raw
        for part in section.split("."):
            node = node.setdefault(part, {})
        node[key] = value
    run_simulation(prepare_run(build_scenario(raw)), run_dir, QuietObserver())
    clients = read_table(run_dir, "clients").to_pydict()
    rows = sorted(zip(*(clients[column] for column in COLUMNS)))
    return [[_exact(value) for value in row] for row in rows]


def _restart_pinned(arguments: list[str]) -> None:
    """This command again, started with the portable environment, at most once: a
    process that was restarted and still is not pinned stops and says which library
    ignored its pin (restarting again would loop without end)."""
    import json
    import os

    from hdcfl_ray.portable.environment import portable_environment
    from hdcfl_ray.portable.process import require_pinned_process, unpinned_libraries
    from hdcfl_ray.portable.restart import RESTARTED

    if not unpinned_libraries():
        return
    if RESTARTED in os.environ:
        require_pinned_process("the restarted tests.bit_reference")
    environment = {**os.environ, **portable_environment(), RESTARTED: json.dumps({})}
    os.execve(sys.executable, [sys.executable, "-m", "tests.bit_reference", *arguments], environment)


def main(arguments: list[str]) -> None:
    """[--portable] [--print] [METHOD ...]: record every method (or those named) into
    this machine's golden file, or the portable one; --print writes the rows to
    stdout as JSON instead."""
    from hdcfl_ray.algorithms.registry import method_names

    portable, show = "--portable" in arguments, "--print" in arguments
    methods = [argument for argument in arguments if not argument.startswith("--")]
    if portable:
        _restart_pinned(arguments)
    path = PORTABLE_GOLDEN if portable else golden_path(arithmetic_key())
    # naming methods re-records just those (a method whose results were meant to change)
    golden = json.loads(path.read_text()) if methods and path.exists() and not show else {}
    with tempfile.TemporaryDirectory() as scratch:
        for method in methods or method_names():
            golden[method] = quickstart_rows(method, Path(scratch) / method, portable)
            if not show:
                print(method, len(golden[method]), "rows", flush=True)
    if show:
        print(json.dumps(golden))
        return
    path.write_text(json.dumps(golden, indent=0) + "\n")
    print("wrote", path)


if __name__ == "__main__":
    main(sys.argv[1:])
