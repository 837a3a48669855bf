"""The Ray backend: client host actors packed with logical clients, and their server,
on the cluster a `RaySession` is joined to.

It puts the dataset in the object store once, starts the hosts (each from a
`HostSpec`, which the server keeps to replace a host that dies) and the server,
and forwards the driver's calls to the server. Imported only for a Ray run.

Where the server runs (`server_in_driver`): a run in the process's main thread
hosts it in the driver, a plain `FederatedServer` reaching the host actors
through `RayTransport`, as a server actor would. The driver is a Ray worker
like an actor (it owns the refs of the clients' states, which outlive any
host), and the server is a pure function of its inputs, so the results are
the same bits; what it saves is an actor process (a Ray worker, the server's
imports, ~150 MB) started beside the hosts on a run's critical path, and a
round trip per driver call. A server actor remains for a run in a worker
thread (a sweep's: it polls for stop signals between waits, which the main
thread receives) and for a driver joined through Ray Client (`ray://`), whose
traffic to the hosts would cross the client link.
"""

from __future__ import annotations

import copy
import threading
import uuid
from typing import Any

import ray

from hdcfl_ray.config.methods import build_algorithm
from hdcfl_ray.config.schema import Scenario
from hdcfl_ray.contract import Method, ModelParams
from hdcfl_ray.plugin_shipping import actor_options
from hdcfl_ray.portable.ray_options import with_portable_environment
from hdcfl_ray.runtime.backends.actors import AsyncServerActor, ServerActor
from hdcfl_ray.runtime.backends.choice import Backend
from hdcfl_ray.runtime.backends.host_spec import HostSpec
from hdcfl_ray.runtime.backends.placement import assign_clients, count_hosts
from hdcfl_ray.config.runtime_resolved import torch_threads_per_host
from hdcfl_ray.runtime.initial_model import independent_initialisations, initial_parameters
from hdcfl_ray.runtime.interrupts import raise_if_received, received
from hdcfl_ray.runtime.server.messages import StoreRef
from hdcfl_ray.runtime.server.settings import ServerSettings, build_server_settings


class RayBackend:
    """Client host actors, and their server (in this process or an actor), on the Ray
    cluster `session` is joined to."""

    name: Backend = "ray"

    def __init__(self, prepared: Any, session: Any) -> None:
        scenario = prepared.scenario
        self.host_runtime = scenario.runtime
        self.session = session
        num_clients = prepared.partition.num_clients
        self.num_hosts = count_hosts(scenario.runtime, num_clients, session.cpus, session.gpus)
        session.check_capacity(self.num_hosts)
        self.client_hosts = assign_clients(num_clients, self.num_hosts)
        algorithm = build_algorithm(scenario, prepared.privacy)
        initial = initial_parameters(scenario, prepared.dataset)
        independent = independent_initialisations(scenario, prepared.dataset, algorithm.independent_inits)
        self.hosts, self._host_spec = start_hosts(prepared, self.client_hosts, self.num_hosts, algorithm, initial)
        settings = build_server_settings(scenario, prepared.partition, prepared.privacy)
        self.server_in_driver = server_in_driver(scenario.runtime.address)
        self.server = start_server(
            settings, algorithm, self.hosts, self.client_hosts, initial, independent, self._host_spec, scenario.runtime.max_restarts,
            in_driver=self.server_in_driver, portable=scenario.runtime.portable,
        )
        wait_until_ready(self.hosts, None if self.server_in_driver else self.server)
        self.fetch = ray.get
        self.put = ray.put

    def call(self, method: str, *args: Any) -> Any:
        if self.server_in_driver:  # the main thread: a stop signal raises inside the server's waits
            return getattr(self.server, method)(*args)
        result = getattr(self.server, method).remote(*args)
        if threading.current_thread() is threading.main_thread():
            return ray.get(result)  # a stop signal raises here (interrupts.stop_signals)
        # A sweep's run in a worker thread, which signals never reach: it notices a
        # stop signal between waits and unwinds as the main thread would.
        while not ray.wait([result], timeout=0.5)[0]:
            raise_if_received()
        return ray.get(result)

    def host_names(self) -> list[str]:
        return ray.get([host.actor_name.remote() for host in self.hosts])

    def host_nodes(self) -> list[str | None]:
        return ray.get([host.node_id.remote() for host in self.hosts])

    def host_hardware(self) -> list[dict[str, Any]]:
        return ray.get([host.hardware.remote() for host in self.hosts])

    def describe(self) -> dict[str, Any]:
        return {"backend": "ray", **self.session.describe(), "torch_threads_per_host": torch_threads_per_host(self.host_runtime)}

    def close(self) -> None:
        if self.server_in_driver:
            actors = [*self.server.host_handles(), *self.hosts]
        else:
            try:
                # a run stopped by a signal does not wait for the server's round to end
                replacements = ray.get(self.server.host_handles.remote(), timeout=2.0 if received() is not None else None)
            except Exception:  # the server is gone (or busy, when stopped): kill what we know of
                replacements = []
            actors = [self.server, *replacements, *self.hosts]
        for actor in actors:
            ray.kill(actor)
        self._host_spec = None


def start_hosts(
    prepared,  # PreparedRun; untyped here to avoid an import cycle
    client_hosts: dict[int, int],
    num_hosts: int,
    algorithm: Method,
    initial: ModelParams,
) -> tuple[list, HostSpec]:
    scenario: Scenario = prepared.scenario
    dataset = prepared.dataset
    # One copy of every array in the object store; hosts on a node read it without copies.
    arrays = [StoreRef(ray.put(a)) for a in (dataset.train_images, dataset.train_labels, dataset.test_images, dataset.test_labels)]
    clients_of_host: dict[int, list] = {host: [] for host in range(num_hosts)}
    for client in prepared.partition.clients:
        clients_of_host[client_hosts[client.client_id]].append(client)
    spec = HostSpec(
        # A dead host is replaced by the server (runtime.max_restarts times), not restarted by Ray.
        # Plugins' names go with every host, which may start on a node that never saw the driver's environment.
        # runtime.portable: each host's worker process starts with the pins, on any node
        options=with_portable_environment(
            {"num_cpus": scenario.runtime.num_cpus_per_actor, "num_gpus": scenario.runtime.num_gpus_per_actor, **actor_options()},
            scenario.runtime.portable,
        ),
        name_prefix=f"hdcfl-host-{uuid.uuid4().hex[:8]}",
        shared_args=(scenario, algorithm, *arrays),
        clients_of_host=tuple(StoreRef(ray.put(clients_of_host[h])) for h in range(num_hosts)),
        initial=StoreRef(ray.put(initial)),
        num_classes=dataset.num_classes,
    )
    hosts = [spec.spawn(host_index) for host_index in range(num_hosts)]
    # Not awaited here: the server actor starts while the hosts load torch (see wait_until_ready).
    # The caller keeps `spec` (and so the data) alive for the whole run.
    return hosts, spec


def wait_until_ready(hosts: list, server=None) -> None:
    """Block until every actor is constructed, so construction errors surface before round 1."""
    ray.get([host.client_ids.remote() for host in hosts] + ([server.host_handles.remote()] if server is not None else []))


def server_in_driver(address: str | None) -> bool:
    """The driver hosts the server in a run on the main thread, not joined through Ray
    Client (the module docstring says why)."""
    return threading.current_thread() is threading.main_thread() and not (address or "").startswith("ray://")


def start_server(
    settings: ServerSettings,
    algorithm: Method,
    hosts: list,
    client_hosts: dict[int, int],
    initial: ModelParams,
    independent: list[ModelParams],
    host_spec: HostSpec,
    max_replacements: int,
    in_driver: bool,
    portable: bool = False,
):
    """The run's server: in this process (`in_driver`), reaching the host actors
    through Ray, or as an actor. In this process it gets its own copies of the method
    and the initial weights, as an actor gets them through the object store: the host
    spec keeps the originals to rebuild hosts from, and the server's state must never
    share arrays with them."""
    if in_driver:
        from hdcfl_ray.runtime.server.async_server import AsyncFederatedServer
        from hdcfl_ray.runtime.server.sync_server import FederatedServer
        from hdcfl_ray.runtime.server.transport import RayTransport

        server_class = AsyncFederatedServer if settings.protocol.mode == "async" else FederatedServer
        algorithm, initial, independent, settings = copy.deepcopy((algorithm, initial, independent, settings))
        return server_class(
            algorithm, hosts, client_hosts, initial, independent, settings,
            transport=RayTransport(), host_spawner=host_spec, max_replacements=max_replacements,
        )  # fmt: skip
    # The server actor mostly waits on clients; it takes no CPU slot away from them.
    actor_class = AsyncServerActor if settings.protocol.mode == "async" else ServerActor
    return actor_class.options(**with_portable_environment({"num_cpus": 0, **actor_options()}, portable)).remote(
        algorithm, hosts, client_hosts, initial, independent, settings, host_spawner=host_spec, max_replacements=max_replacements
    )
