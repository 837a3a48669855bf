"""FedAvg-SE: sample-weighted averaging of the encoder; every client keeps its own head.

The shared trajectory HDC-FL builds on. A client is scored with the global
encoder and its own head (reference (a))."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from hdcfl_ray.algorithms.aggregate import weighted_average
from hdcfl_ray.algorithms.base import CachedClient, ClientUpdate, LocalTrainingPlan, RefreshOutcome


class FedAvgSE:
    name = "fedavg_se"
    uses_personalisation = False

    def local_training(self) -> LocalTrainingPlan:
        return LocalTrainingPlan(train_head=True)

    def aggregate(self, global_encoder: np.ndarray, updates: Sequence[ClientUpdate]) -> np.ndarray:
        if not updates:
            return global_encoder
        ordered = sorted(updates, key=lambda update: update.client_id)
        return weighted_average([u.encoder for u in ordered], [u.num_samples for u in ordered])

    def is_refresh_round(self, round_index: int) -> bool:
        return False

    def refresh(self, round_index: int, global_encoder: np.ndarray, cache: Mapping[int, CachedClient]) -> RefreshOutcome | None:
        return None
