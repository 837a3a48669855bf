"""Starting or joining Ray for one run, and checking the cluster can host the actors.

A Ray instance started here (`runtime.address: null`) is private to this
machine, and every service it runs listens on loopback only: the GCS, the
raylet and its object manager, the workers and the driver's core worker, the
runtime-env and dashboard agents, and the dashboard. Ray binds those services
to the node's IP address, which on Linux it takes from the route to the
outside; on macOS and Windows it uses 127.0.0.1 instead, under its own switch
`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`. `start_private_ray` applies that
single-machine rule for the start of a private instance (the processes Ray
starts inherit it) and then checks the node address Ray chose. Joining a
cluster (`runtime.address`) is the only way to listen elsewhere.
"""

from __future__ import annotations

import os
import threading
import uuid
from contextlib import contextmanager
from typing import Any, Iterator

import ray

from hdcfl_ray.runtime.machine_checks import Capacity, check_actor_capacity, check_cluster_reachable, is_loopback_host
from hdcfl_ray.config.schema import RuntimeConfig
from hdcfl_ray.errors import RayStartFailed, ScenarioError, failure_text

# Ray's switch between a cluster node (node IP = the machine's external address) and a
# single machine (node IP = loopback): an environment variable for the processes Ray
# starts, read once into `ray_constants.ENABLE_RAY_CLUSTER` in this one.
SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def _quiet_ray_environment() -> None:
    # Ray warns loudly about things a simulator user cannot act on.
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    # Workers Ray granted no GPU see none (CUDA_VISIBLE_DEVICES=""): a host or task that
    # asked for no GPU cannot open a CUDA context behind Ray's accounting. Hosts choose
    # their device from the grant anyway (runtime/client/device.py); this makes it hold
    # for everything else a worker runs too.
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "1")


@contextmanager
def _single_machine() -> Iterator[None]:
    """Ray's single-machine rule (every service and the driver on loopback) for one
    `ray.init` of this process; a later join of a real cluster advertises the
    machine's address again."""
    from ray._private import ray_constants

    saved_env = os.environ.get(SINGLE_MACHINE_ENV)
    saved_flag = getattr(ray_constants, "ENABLE_RAY_CLUSTER", True)
    os.environ[SINGLE_MACHINE_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        if saved_env is None:
            os.environ.pop(SINGLE_MACHINE_ENV, None)
        else:
            os.environ[SINGLE_MACHINE_ENV] = saved_env


def _joins_loopback(address: str) -> bool:
    """A cluster address on loopback (e.g. a private instance's GCS, 127.0.0.1:PORT):
    the driver that joins it must listen on loopback too, or the cluster cannot reach it."""
    host = address.removeprefix("ray://").rsplit(":", 1)[0].strip("[]")
    return host not in ("", "auto") and is_loopback_host(host)


def _plugins_for_workers() -> dict[str, Any]:
    """`ray.init`'s runtime_env when plugins are loaded: every worker of the job gets
    their code and names (hdcfl_ray/plugin_shipping.py); no argument without plugins."""
    from hdcfl_ray.plugin_shipping import ray_runtime_env

    environment = ray_runtime_env()
    return {"runtime_env": environment} if environment else {}


# Every process of a private Ray instance carries this variable in its environment
# (Ray's processes inherit it from the driver, and the agents and workers from the
# raylet), valued uniquely per instance: after a shutdown, those still alive are
# found by it even when their parent has died, and are stopped.
OWNER_ENV = "HDCFL_RAY_INSTANCE"


def start_private_ray(num_cpus: int | None, include_dashboard: bool = False, dashboard_host: str = "127.0.0.1") -> str:
    """Start a fresh Ray instance in this process whose services listen on loopback only;
    returns the marker its processes carry (see `stop_private_ray`)."""
    from hdcfl_ray.runtime.interrupts import ray_keeps_our_handlers

    _quiet_ray_environment()
    kwargs: dict[str, Any] = {"include_dashboard": include_dashboard, **_plugins_for_workers()}
    if include_dashboard:
        kwargs["dashboard_host"] = dashboard_host
    marker = f"{os.getpid()}-{uuid.uuid4().hex}"
    os.environ[OWNER_ENV] = marker
    try:
        with _single_machine(), ray_keeps_our_handlers():
            # "local" starts a fresh instance even when a `ray start` cluster runs on this
            # machine (ray.init() alone would join it): address null means a private Ray.
            # Ray's own start-up notices are noise to a simulator user; failures still raise.
            ray.init(address="local", num_cpus=num_cpus, logging_level="ERROR", configure_logging=True, **kwargs)
    except BaseException as error:  # a failed or interrupted start: stop whatever it started
        os.environ.pop(OWNER_ENV, None)
        stop_private_ray(marker)
        if isinstance(error, Exception):
            raise RayStartFailed(
                f"Ray could not start on this machine ({failure_text(error).splitlines()[0]}). A Ray left over from a killed process "
                "can hold its ports and memory (`ray stop` stops every Ray process on this machine, a running sweep's too), and a machine short of "
                "memory or CPU time can make its start time out; a single run does not need Ray "
                "(hdcfl-ray simulate ... --set runtime.backend=local)"
            ) from error
        raise
    os.environ.pop(OWNER_ENV, None)
    node_ip = ray.util.get_node_ip_address()
    if not is_loopback_host(node_ip):  # a Ray that no longer follows the rule above
        ray.shutdown()
        raise RuntimeError(
            f"the private Ray instance chose the node address {node_ip}, not loopback, so its services would be "
            "reachable from other machines; it was stopped. Start Ray yourself (ray start --head "
            "--node-ip-address=127.0.0.1) and join it with runtime.address"
        )
    return marker


def stop_private_ray(marker: str, grace_s: float = 5.0) -> list[int]:
    """Shut Ray down, then wait up to `grace_s` for every process of the instance
    `marker` names to exit and kill those that have not (Ray's agents outlive a
    shutdown that is cut short, or a start that is interrupted). Signals stay ignored
    meanwhile. Returns the pids killed."""
    import signal
    import time

    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread:  # a second Ctrl-C must not cut the shutdown short
        for signum in previous:
            signal.signal(signum, signal.SIG_IGN)
    try:
        tracked = instance_processes(marker)  # before the shutdown, while parents still link them
        _kill_autoscaler_monitor()
        try:
            if ray.is_initialized():
                ray.shutdown()
        except Exception:  # a half-started instance: its processes are stopped below
            pass
        deadline = time.monotonic() + grace_s
        while True:
            tracked.update(instance_processes(marker))
            alive = [pid for pid, started in tracked.items() if _process_start(pid) == started]
            if not alive or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        killed = []
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except OSError:
                pass
        return killed
    finally:
        if main_thread:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def _kill_autoscaler_monitor() -> None:
    """Kill the private instance's autoscaler monitor before `ray.shutdown`. A private
    instance never scales, and the monitor keeps no state; but it answers SIGTERM
    by reporting its "failure" to the GCS, which `ray.shutdown` has stopped by then,
    so it hangs until Ray kills it after a one-second grace: a second of every
    run's shutdown. Ray's private process table; nothing is done if it moved."""
    try:
        from ray._private import ray_constants, worker

        node = getattr(worker, "_global_node", None)
        infos = list(node.all_processes.get(ray_constants.PROCESS_TYPE_MONITOR, [])) if node is not None else []
    except Exception:
        return
    for info in infos:
        process = getattr(info, "process", None)
        if process is None or process.poll() is not None:
            continue
        try:
            process.kill()
            process.wait(timeout=1.0)
        except Exception:  # gone already, or not reaped in time: ray.shutdown and the sweep below handle it
            pass


def instance_processes(marker: str) -> dict[int, int]:
    """Live processes of the instance `marker` names, pid -> start time: those whose
    environment holds OWNER_ENV=`marker` (the GCS, the raylet, ...) and their
    descendants (the agents and workers the raylet starts, whose environment Ray's
    process titles may overwrite). Linux's /proc; elsewhere none are found and Ray's
    own shutdown is relied on."""
    wanted = f"{OWNER_ENV}={marker}".encode()
    table = _process_table()
    marked = []
    for pid in table:
        if pid == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                if wanted in handle.read().split(b"\0"):
                    marked.append(pid)
        except OSError:  # gone, or not ours to read
            continue
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found: dict[int, int] = {}
    todo = list(marked)
    while todo:
        pid = todo.pop()
        if pid in found or pid == os.getpid():
            continue
        found[pid] = table[pid][1]
        todo.extend(children.get(pid, []))
    return found


def _process_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, start time) of every live, non-zombie process."""
    table: dict[int, tuple[int, int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None and fields[0] != "Z":
                table[int(entry)] = (int(fields[1]), int(fields[19]))
    return table


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name: state, ppid, ..., start time at [19]."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].decode().split()
    except (OSError, IndexError):
        return None


def _process_start(pid: int) -> int | None:
    """A live process's start time (None when gone or a zombie): a pid reused by
    another process has another start time, so it is never killed by mistake."""
    fields = _stat_fields(pid)
    return None if fields is None or fields[0] == "Z" else int(fields[19])


class RaySession:
    """Context manager: joins an existing Ray (a test fixture, `--address auto`) or
    starts a private one, and shuts down only what it started."""

    def __init__(self, runtime: RuntimeConfig) -> None:
        self.runtime = runtime
        self.started_here = False
        self.marker: str | None = None  # a private instance's, for stop_private_ray

    def __enter__(self) -> "RaySession":
        if not ray.is_initialized():
            if self.runtime.address is None:
                self.marker = start_private_ray(self.runtime.num_cpus, self.runtime.include_dashboard, self.runtime.dashboard_host)
            else:
                from hdcfl_ray.runtime.interrupts import ray_keeps_our_handlers

                _quiet_ray_environment()
                check_cluster_reachable(self.runtime.address)
                plugins = _plugins_for_workers()
                try:
                    if _joins_loopback(self.runtime.address):
                        with _single_machine(), ray_keeps_our_handlers():
                            ray.init(address=self.runtime.address, logging_level="ERROR", configure_logging=True, **plugins)
                    else:
                        with ray_keeps_our_handlers():
                            ray.init(address=self.runtime.address, logging_level="ERROR", configure_logging=True, **plugins)
                except ConnectionError as error:  # Ray's answer when no cluster is at the address
                    raise ScenarioError(
                        f"runtime.address: {self.runtime.address!r}: no Ray cluster to join ({str(error).strip().splitlines()[0]}); "
                        "start one with ray start --head, or set runtime.address: null for a private instance"
                    ) from None
            self.started_here = True
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the instance this session started (a private one with every process
        it left); a second call does nothing."""
        marker, started_here = self.marker, self.started_here
        self.marker, self.started_here = None, False
        if marker is not None:
            stop_private_ray(marker)
        elif started_here:
            ray.shutdown()

    def close_for_good(self) -> None:
        """As close(), and no thread may start a new Ray instance afterwards (Ray starts
        one on the first task or actor created without a connection): a sweep's run
        still starting in a thread when a stop signal closes the session fails
        instead of leaving an instance nobody stops."""
        import ray._private.auto_init_hook as auto_init_hook

        auto_init_hook.enable_auto_connect = False
        self.close()

    @property
    def cpus(self) -> float:
        return float(ray.cluster_resources().get("CPU", 0.0))

    @property
    def gpus(self) -> float:
        return float(ray.cluster_resources().get("GPU", 0.0))

    def capacity(self) -> Capacity:
        return Capacity(self.cpus, self.gpus, "the Ray cluster")

    def describe(self) -> dict[str, Any]:
        resources = ray.cluster_resources()
        return {
            "address": self.runtime.address or "local",
            "nodes": len([node for node in ray.nodes() if node.get("Alive")]),
            "cpus": resources.get("CPU", 0.0),
            "gpus": resources.get("GPU", 0.0),
            "ray_version": ray.__version__,
        }

    def check_capacity(self, num_hosts: int, runtime: RuntimeConfig | None = None) -> None:
        """Actors that cannot all be placed would wait forever: refuse up front."""
        check_actor_capacity(runtime or self.runtime, num_hosts, self.capacity())
