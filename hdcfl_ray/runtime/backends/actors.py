"""Ray actor wrappers: thin shells around ClientHost and FederatedServer."""

from __future__ import annotations

import uuid

import ray

from hdcfl_ray.config.schema import Scenario
from hdcfl_ray.contract import Method, ModelParams
from hdcfl_ray.runtime.server.async_server import AsyncFederatedServer
from hdcfl_ray.runtime.client.client_host import ClientHost
from hdcfl_ray.runtime.backends.host_spec import HostSpec
from hdcfl_ray.runtime.server.messages import StoreRef
from hdcfl_ray.runtime.server.sync_server import FederatedServer, ServerSettings

ClientHostActor = ray.remote(ClientHost)
ServerActor = ray.remote(FederatedServer)
AsyncServerActor = ray.remote(AsyncFederatedServer)


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
        options={"num_cpus": scenario.runtime.num_cpus_per_actor, "num_gpus": scenario.runtime.num_gpus_per_actor},
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


def wait_until_ready(hosts: list, server) -> None:
    """Block until every actor is constructed, so construction errors surface before round 1."""
    ray.get([host.client_ids.remote() for host in hosts] + [server.host_handles.remote()])


def start_server(
    settings: ServerSettings,
    algorithm: Method,
    hosts: list,
    client_hosts: dict[int, int],
    initial: ModelParams,
    independent: list[ModelParams],
    host_spec: HostSpec,
    max_replacements: int,
):
    # The server mostly waits on clients; it takes no CPU slot away from them.
    actor_class = AsyncServerActor if settings.protocol.mode == "async" else ServerActor
    return actor_class.options(num_cpus=0).remote(
        algorithm, hosts, client_hosts, initial, independent, settings, host_spawner=host_spec, max_replacements=max_replacements
    )
