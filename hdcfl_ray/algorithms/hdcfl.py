"""HDC-FL: FedAvg-SE's trajectory plus, at refresh rounds, head-derived groups,
encoder prototypes from the cache and a soft mixture per client (spec/hdcfl.md).

The personalised encoders are for inference only: training always starts from
the global encoder, so lambda = 0 and HDC-FL are scored from the same run."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from hdcfl_ray.algorithms.base import CachedClient, Personalisation, RefreshOutcome
from hdcfl_ray.algorithms.fedavg_se import FedAvgSE
from hdcfl_ray.config.schema import HDCFLParams
from hdcfl_ray.hdcfl.refresh import refresh_groups


def default_activation_round(rounds: int) -> int:
    """t_a defaults to 20% of the rounds, at least round 1."""
    return max(1, int(round(0.2 * rounds)))


class HDCFL(FedAvgSE):
    name = "hdcfl"
    uses_personalisation = True

    def __init__(self, params: HDCFLParams, rounds: int, seed: int) -> None:
        self.params = params
        self.rounds = rounds
        self.seed = seed
        self.activation_round = params.activation_round or default_activation_round(rounds)

    def is_refresh_round(self, round_index: int) -> bool:
        if round_index < self.activation_round:
            return False
        return (round_index - self.activation_round) % self.params.refresh_every == 0 or round_index == self.rounds

    def refresh_index(self, round_index: int) -> int:
        """How many refreshes came before this round (derived, so a resumed run agrees)."""
        return sum(1 for earlier in range(1, round_index) if self.is_refresh_round(earlier))

    def refresh(self, round_index: int, global_encoder: np.ndarray, cache: Mapping[int, CachedClient]) -> RefreshOutcome | None:
        if not cache:
            return None
        client_ids = sorted(cache)
        heads = np.stack([cache[k].head for k in client_ids])
        encoders = np.stack([cache[k].encoder for k in client_ids])
        counts = np.asarray([cache[k].num_samples for k in client_ids], dtype=np.float64)
        # k-means is seeded by the run seed and the refresh index, so a run is reproducible.
        result = refresh_groups(heads, encoders, counts, self.params, seed=self.seed + self.refresh_index(round_index))
        personalisation = Personalisation(
            prototypes=result.prototypes,
            memberships={k: result.memberships[i] for i, k in enumerate(client_ids)},
            group_labels={k: int(result.labels[i]) for i, k in enumerate(client_ids)},
            mix=self.params.mix,
            refresh_round=round_index,
        )
        return RefreshOutcome(
            personalisation=personalisation,
            silhouette=float(result.silhouette),
            effective_rank=int(result.effective_rank),
            num_groups=int(result.prototypes.shape[0]),
            descriptor_kind=self.params.descriptor,
        )
