"""The Ray actor classes: thin shells around the plain `ClientHost` and the two servers.

Ray imports this module in every process that builds one of these actors: the
driver, and a server actor that replaces a dead host (through `HostSpec.spawn`).
Starting them is `ray_backend`'s job.
"""

from __future__ import annotations

import ray

from hdcfl_ray.runtime.client.client_host import ClientHost
from hdcfl_ray.runtime.server.async_server import AsyncFederatedServer
from hdcfl_ray.runtime.server.sync_server import FederatedServer

ClientHostActor = ray.remote(ClientHost)
ServerActor = ray.remote(FederatedServer)
AsyncServerActor = ray.remote(AsyncFederatedServer)
