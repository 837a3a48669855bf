"""A Ray instance hdcfl-ray starts for itself listens on loopback only: every
socket any of its processes listens on (TCP) or is bound to (UDP), sampled
during a run, has a loopback address."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

import pytest
import yaml

from tests.conftest import tiny_scenario

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads listening sockets from Linux's /proc"),
]

REPO = Path(__file__).resolve().parents[1]
# /proc/net state codes: TCP LISTEN, and UDP sockets bound but not connected
LISTENING = {"tcp": "0A", "tcp6": "0A", "udp": "07", "udp6": "07"}


def _decode_address(hex_address: str) -> tuple[str, int]:
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    # the kernel prints each 32-bit word in host (little-endian) order
    ordered = b"".join(raw[index : index + 4][::-1] for index in range(0, len(raw), 4))
    return str(ipaddress.ip_address(ordered)), int(port, 16)


def _descendants(root: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in found]
        found.update(children)
        frontier.extend(children)
    return found


def _process_name(pid: int) -> str:
    """The executable's name, or a Python process's script (dashboard.py, ...)."""
    name = Path(f"/proc/{pid}/comm").read_text().strip()
    if name.startswith("python"):
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        scripts = [Path(argument).name for argument in arguments[1:3] if argument.endswith(".py")]
        return scripts[-1] if scripts else name
    return name


def listening_sockets(pids: set[int]) -> set[tuple[str, str, int]]:
    """(process name, address, port) of every listening or bound socket of `pids`."""
    owners: dict[str, str] = {}
    for pid in pids:
        try:
            name = _process_name(pid)
            descriptors = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for descriptor in descriptors:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{descriptor}")
            except OSError:
                continue
            if target.startswith("socket:["):
                owners[target[len("socket:[") : -1]] = name
    sockets: set[tuple[str, str, int]] = set()
    for table, state in LISTENING.items():
        try:
            lines = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == state and fields[9] in owners:
                sockets.add((owners[fields[9]], *_decode_address(fields[1])))
    return sockets


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def run_and_sample(
    scenario: dict, tmp_path: Path, probe: Callable[[set[tuple[str, str, int]]], None] | None = None
) -> tuple[set[tuple[str, str, int]], subprocess.CompletedProcess]:
    """Run `hdcfl-ray simulate` on `scenario` in a child process and sample the
    sockets of it and every process it starts until it exits (`probe` sees each sample)."""
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario, sort_keys=False))
    environment = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    child = subprocess.Popen(
        [sys.executable, "-c", "from cli import app; app()", "simulate", str(path), "--out", str(tmp_path / "run"), "-q"],
        cwd=REPO, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    seen: set[tuple[str, str, int]] = set()
    deadline = time.monotonic() + 300
    while child.poll() is None and time.monotonic() < deadline:
        sample = listening_sockets(_descendants(child.pid))
        seen |= sample
        if probe is not None:
            probe(sample)
        time.sleep(0.2)
    if child.poll() is None:
        child.kill()
    stdout, stderr = child.communicate(timeout=60)
    return seen, subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)


def ray_run(**runtime: object) -> dict:
    return tiny_scenario(
        runtime={"backend": "ray", "num_cpus": 2, "clients_per_actor": "auto", "num_cpus_per_actor": 1, **runtime},
        protocol={"rounds": 2, "participation": 1.0, "local_epochs": 1, "batch_size": 32},
        checkpoint={"every": None},
    )


def test_a_private_ray_run_listens_on_loopback_only(tmp_path: Path) -> None:
    seen, completed = run_and_sample(ray_run(), tmp_path)
    assert completed.returncode == 0, completed.stderr[-3000:]
    names = {name for name, _, _ in seen}
    assert {"gcs_server", "raylet"} <= names, f"sampled too late to see Ray's services: {sorted(seen)}"
    exposed = sorted(socket for socket in seen if not is_loopback(socket[1]))
    assert not exposed, f"listening beyond loopback: {exposed}"


def test_the_test_sessions_ray_listens_on_loopback_only(ray_session: None) -> None:
    import ray

    @ray.remote
    def pid() -> int:
        return os.getpid()

    assert ray.get(pid.remote()) != os.getpid()  # a worker runs, so its sockets exist
    seen = listening_sockets(_descendants(os.getpid()))
    assert {"gcs_server", "raylet"} <= {name for name, _, _ in seen}
    exposed = sorted(socket for socket in seen if not is_loopback(socket[1]))
    assert not exposed, f"listening beyond loopback: {exposed}"


def _dashboard_installed() -> bool:
    try:
        import ray.dashboard.optional_deps  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _dashboard_installed(), reason='the dashboard extra is not installed (pip install -e ".[dashboard]")')
def test_the_dashboard_serves_on_loopback_only(tmp_path: Path) -> None:
    scenario = ray_run(include_dashboard=True)
    scenario["protocol"]["rounds"] = 6  # long enough to ask the dashboard while the run goes on
    answers: list[int] = []

    def ask_dashboard(sample: set[tuple[str, str, int]]) -> None:
        if not answers:
            for name, address, port in sample:
                status = _http_status(f"http://127.0.0.1:{port}/") if name == "dashboard.py" else None
                if status is not None:
                    answers.append(status)

    seen, completed = run_and_sample(scenario, tmp_path, ask_dashboard)
    assert completed.returncode == 0, completed.stderr[-3000:]
    exposed = sorted(socket for socket in seen if not is_loopback(socket[1]))
    assert not exposed, f"listening beyond loopback: {exposed}"
    assert "dashboard.py" in {name for name, _, _ in seen}, sorted(seen)
    # 200, or 401 under Ray's token authentication (the browser then asks for ~/.ray/auth_token)
    assert answers and answers[0] in (200, 401), answers


@pytest.mark.skipif(_dashboard_installed(), reason="the dashboard extra is installed")
def test_the_dashboard_without_its_extra_exits_2_naming_the_extra(tmp_path: Path) -> None:
    # in a child process: this one may hold the test session's Ray, which a run would join
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(ray_run(include_dashboard=True), sort_keys=False))
    environment = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    for command in (["validate", str(path)], ["simulate", str(path), "--out", str(tmp_path / "run")]):
        result = subprocess.run(
            [sys.executable, "-c", "from cli import app; app()", *command], cwd=REPO, env=environment, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 2, result.stderr
        assert "runtime.include_dashboard" in result.stderr and 'pip install -e ".[dashboard]"' in result.stderr
        assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


def _http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:  # 401 under Ray's token authentication: it answered
        return error.code
    except OSError:
        return None
