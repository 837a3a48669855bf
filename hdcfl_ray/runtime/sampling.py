"""Which clients take part in a round: a pure function of (seed, round)."""

from __future__ import annotations

import numpy as np


def select_clients(num_clients: int, clients_per_round: int, seed: int, round_index: int) -> list[int]:
    if clients_per_round >= num_clients:
        return list(range(num_clients))
    rng = np.random.default_rng(np.random.SeedSequence([seed, round_index, 0x5A3]))
    chosen = rng.choice(num_clients, size=clients_per_round, replace=False)
    return sorted(int(client_id) for client_id in chosen)
