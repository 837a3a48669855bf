"""Ray actor wrappers: thin shells around ClientHost and FederatedServer."""

from __future__ import annotations

import uuid

import ray

from hdcfl_ray.algorithms.base import Algorithm, ModelParams
from hdcfl_ray.config.schema import Scenario
from hdcfl_ray.runtime.client_host import ClientHost
from hdcfl_ray.runtime.async_server import AsyncFederatedServer
from hdcfl_ray.runtime.server import FederatedServer, ServerSettings

ClientHostActor = ray.remote(ClientHost)
ServerActor = ray.remote(FederatedServer)
AsyncServerActor = ray.remote(AsyncFederatedServer)


def start_hosts(
    prepared,  # PreparedRun; untyped here to avoid an import cycle
    client_hosts: dict[int, int],
    num_hosts: int,
    algorithm: Algorithm,
    initial: ModelParams,
) -> tuple[list, list]:
    scenario: Scenario = prepared.scenario
    dataset = prepared.dataset
    # One copy of every array in the object store; hosts on a node read it without copies.
    train_images_ref = ray.put(dataset.train_images)
    train_labels_ref = ray.put(dataset.train_labels)
    test_images_ref = ray.put(dataset.test_images)
    test_labels_ref = ray.put(dataset.test_labels)
    clients_of_host: dict[int, list] = {host: [] for host in range(num_hosts)}
    for client in prepared.partition.clients:
        clients_of_host[client_hosts[client.client_id]].append(client)
    options = {
        "num_cpus": scenario.runtime.num_cpus_per_actor,
        "num_gpus": scenario.runtime.num_gpus_per_actor,
        "max_restarts": scenario.runtime.max_restarts,
    }
    run_token = uuid.uuid4().hex[:8]
    hosts = [
        ClientHostActor.options(**options, name=f"hdcfl-host-{host_index}-{run_token}").remote(
            scenario,
            algorithm,
            train_images_ref,
            train_labels_ref,
            test_images_ref,
            test_labels_ref,
            clients_of_host[host_index],
            initial,
            dataset.num_classes,
        )
        for host_index in range(num_hosts)
    ]
    # Surface construction errors (and wait for torch to load) before round 1.
    ray.get([host.client_ids.remote() for host in hosts])
    # The caller keeps the data refs alive for the whole run: a restarted host is
    # rebuilt from these same constructor arguments.
    return hosts, [train_images_ref, train_labels_ref, test_images_ref, test_labels_ref]


def start_server(
    settings: ServerSettings,
    algorithm: Algorithm,
    hosts: list,
    client_hosts: dict[int, int],
    initial: ModelParams,
    independent: list[ModelParams],
):
    # The server mostly waits on clients; it takes no CPU slot away from them.
    actor_class = AsyncServerActor if settings.protocol.mode == "async" else ServerActor
    return actor_class.options(num_cpus=0).remote(algorithm, hosts, client_hosts, initial, independent, settings)
