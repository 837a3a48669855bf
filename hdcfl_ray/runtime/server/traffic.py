"""The bytes each client downloads and uploads in a round, counted from the messages
the server actually sends and receives (payload_bytes.py says how a value counts).

Counted, per client:

* down: every job the client is sent to train or to answer a probe: each broadcast
  object its task names (once per task, as the client reads it) and its task's
  payload. In asynchronous runs a job's download is counted with its update, in the
  round the update arrives, so a round's rows pair each update with its download.
* up: every training update (its models and values, rejected ones included: they
  were sent) and every probe answer. An update's models are counted by the host
  that made them, by the same rule (`UploadMeta.models_bytes`), so the server never
  fetches an upload it would not otherwise read.
* eval_down: the same for evaluation jobs, kept apart: what a method sends for
  evaluation is part of its protocol for some methods (a personalised model a
  client must download to use) and a simulator artefact for others.

Newcomers (partition.newcomers) have a ledger of their own (`RoundTraffic.newcomers`):
what the server sends a newcomer to be placed and scored (its probe job and its
evaluation job, each counted as a training job is) under down, its probe answer under
up; nothing of it is ever in `clients` or in the training counts.

Not counted: the client's state that the server keeps for crash recovery and sends
with each job (a deployed client keeps its own), an update's bookkeeping scalars
(sample count, loss, steps: the same for every method), evaluation scores sent back,
and work the virtual clock cut (a straggler dropped before training is sent nothing).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hdcfl_ray.contract import ClientTask
from hdcfl_ray.runtime.server.payload_bytes import payload_bytes
from hdcfl_ray.runtime.server.transport import Transport


@dataclass(frozen=True)
class ClientTraffic:
    """One client's bytes in one round."""

    up: int = 0
    down: int = 0
    eval_down: int = 0


@dataclass(frozen=True)
class RoundTraffic:
    """Every client's bytes in one round; a client absent from `clients` moved nothing."""

    clients: Mapping[int, ClientTraffic] = field(default_factory=dict)
    # the newcomers' bytes this round (their evaluation), apart from every training client's
    newcomers: Mapping[int, ClientTraffic] = field(default_factory=dict)

    def of(self, client_id: int) -> ClientTraffic:
        return self.clients.get(client_id, ClientTraffic())

    @property
    def up(self) -> int:
        return sum(traffic.up for traffic in self.clients.values())

    @property
    def down(self) -> int:
        return sum(traffic.down for traffic in self.clients.values())

    @property
    def eval_down(self) -> int:
        return sum(traffic.eval_down for traffic in self.clients.values())


class TrafficMeter:
    """Counts a round's bytes as the server sends and receives; `take` ends the round."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        self._object_bytes: dict[str, int] = {}
        self._up: Counter[int] = Counter()
        self._down: Counter[int] = Counter()
        self._eval_down: Counter[int] = Counter()
        self._newcomer_up: Counter[int] = Counter()
        self._newcomer_down: Counter[int] = Counter()

    def _resolve(self, value: Any) -> Any:
        """The object a reference names; any other value as it is."""
        try:
            return self._transport.get(value)
        except (TypeError, ValueError):  # not a reference of this transport
            return value

    def bytes_of(self, value: Any) -> int:
        return payload_bytes(value, self._resolve)

    def broadcast(self, objects: Mapping[str, Any]) -> None:
        """The broadcast objects the next tasks name (sized once, read by every task)."""
        self._object_bytes = {name: self.bytes_of(value) for name, value in objects.items()}

    def task_bytes(self, task: ClientTask) -> int:
        """What a client downloads for `task`: the broadcast objects it names and its payload."""
        return sum(self._object_bytes[name] for name in task.models) + self.bytes_of(dict(task.payload))

    def sent(self, client_id: int, task: ClientTask) -> int:
        """A training or probe job sent now; returns its bytes."""
        nbytes = self.task_bytes(task)
        self._down[client_id] += nbytes
        return nbytes

    def sent_earlier(self, client_id: int, nbytes: int) -> None:
        """A download sized when its job was sent (`task_bytes`), counted in this round."""
        self._down[client_id] += nbytes

    def sent_for_evaluation(self, client_id: int, task: ClientTask) -> None:
        self._eval_down[client_id] += self.task_bytes(task)

    def sent_to_newcomer(self, client_id: int, task: ClientTask) -> None:
        """A newcomer's probe or evaluation job, counted under the newcomer label."""
        self._newcomer_down[client_id] += self.task_bytes(task)

    def received_from_newcomer(self, client_id: int, answer: Any) -> None:
        """A newcomer's probe answer, counted under the newcomer label."""
        self._newcomer_up[client_id] += self.bytes_of(answer)

    def received_update(self, client_id: int, meta: Any, models_ref: Any) -> None:
        """A training update: its models as the host counted them (fetched and counted
        here only for a meta without the count), and its values."""
        models = meta.models_bytes if meta.models_bytes is not None else self.bytes_of(models_ref)
        self._up[client_id] += models + self.bytes_of(meta.values)

    def received(self, client_id: int, *parts: Any) -> None:
        """An update's models (or the reference they are stored under) and values, or a probe answer."""
        self._up[client_id] += sum(self.bytes_of(part) for part in parts)

    def take(self) -> RoundTraffic:
        """The round's counts; the meter starts the next round at zero."""
        clients = sorted(set(self._up) | set(self._down) | set(self._eval_down))
        newcomers = sorted(set(self._newcomer_up) | set(self._newcomer_down))
        traffic = RoundTraffic(
            {k: ClientTraffic(up=self._up[k], down=self._down[k], eval_down=self._eval_down[k]) for k in clients},
            {k: ClientTraffic(up=self._newcomer_up[k], down=self._newcomer_down[k]) for k in newcomers},
        )
        self._up, self._down, self._eval_down = Counter(), Counter(), Counter()
        self._newcomer_up, self._newcomer_down = Counter(), Counter()
        return traffic
