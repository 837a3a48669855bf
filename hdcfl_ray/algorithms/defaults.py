"""Default hooks, so a method overrides only what it changes: sample-based
selection, no probes, a private copy of the initial head per client."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from hdcfl_ray.contract import ClientContext, ClientTask, ModelParams, ResolvedPrivacy, RoundNotes, ServerOptimizerConfig, never_probes


@dataclass
class PrivateHead:
    """Client state of methods whose only private part is the head."""

    head: np.ndarray


class AlgorithmDefaults:
    name = "base"
    independent_inits = 0
    # the step aggregate takes from the clients' mean (RunInfo.server_optimizer); a subclass
    # built without one (a plugin's own __init__) keeps the default, the mean itself
    server_optimizer = ServerOptimizerConfig()
    # the run's privacy (RunInfo.privacy) for a method that accepts it; a subclass built
    # without it (a plugin's own __init__, a method with its own server state) runs without
    privacy: ResolvedPrivacy | None = None

    def select(self, state: Any, round_index: int, sampled: list[int], online: list[int]) -> list[int]:
        return sampled

    @never_probes
    def probe_task(self, state: Any, round_index: int, client_id: int) -> ClientTask | None:
        return None

    def absorb_probes(self, state: Any, round_index: int, results: Mapping[int, Mapping[str, Any]]) -> RoundNotes:
        return RoundNotes()

    def init_client(self, client_id: int, initial: ModelParams) -> Any:
        assert initial.head is not None
        return PrivateHead(head=np.array(initial.head, dtype=np.float32, copy=True))

    def probe(self, ctx: ClientContext, state: Any, task: ClientTask, objects: Mapping[str, Any]) -> Mapping[str, Any]:
        return {}
