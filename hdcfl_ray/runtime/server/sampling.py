"""Who trains in a synchronous round: a pure function of (seed, round), the
clients' availability, and the straggler policy on the virtual clock; under
privacy.sampling: poisson, each training client on its own with rate q."""

from __future__ import annotations

import math
from dataclasses import dataclass

from hdcfl_ray import seeding
from hdcfl_ray.config.schema import AvailabilityConfig, StragglerConfig


def select_clients(num_clients: int, clients_per_round: int, seed: int, round_index: int, candidates: list[int] | None = None) -> list[int]:
    """`clients_per_round` clients drawn without replacement from `candidates` (default all)."""
    pool = list(range(num_clients)) if candidates is None else sorted(candidates)
    if clients_per_round >= len(pool):
        return pool
    rng = seeding.rng(seed, "sampling", round_index)
    chosen = rng.choice(len(pool), size=clients_per_round, replace=False)
    return sorted(pool[int(i)] for i in chosen)


def poisson_sample(num_clients: int, rate: float, seed: int, round_index: int, candidates: list[int]) -> list[int]:
    """Each client of `candidates` independently with probability `rate`, in id order
    (privacy.sampling: poisson, the sampling the accountant's amplification assumes): a
    round may draw none. Client k's draw is the k-th of the round's stream whoever else
    is a candidate, so a client's membership depends on (seed, round, k) alone."""
    draws = seeding.rng(seed, "dp-poisson", round_index).random(num_clients)
    return [client_id for client_id in sorted(candidates) if draws[client_id] < rate]


def evaluation_sample(num_clients: int, eval_clients: str | float | int, seed: int, newcomers: tuple[int, ...] = ()) -> tuple[int, ...]:
    """The clients scored at every evaluated round (`protocol.eval_clients`), in id
    order: all of them, or a sample of a count or fraction drawn once from the seed;
    `newcomers` (scored apart, by their own rule) are never among them and the count
    or fraction is of the others."""
    held_out = set(newcomers)
    pool = [client_id for client_id in range(num_clients) if client_id not in held_out]
    if eval_clients == "all":
        return tuple(pool)
    count = eval_clients if isinstance(eval_clients, int) else max(1, round(float(eval_clients) * len(pool)))
    if count >= len(pool):
        return tuple(pool)
    chosen = seeding.rng(seed, "eval_clients").choice(len(pool), size=count, replace=False)
    return tuple(sorted(pool[int(position)] for position in chosen))


def available_clients(num_clients: int, availability: AvailabilityConfig, seed: int, round_index: int) -> list[int]:
    if availability.kind == "always":
        return list(range(num_clients))
    rng = seeding.rng(seed, "availability", round_index)
    online = rng.random(num_clients) < availability.probability
    return [client_id for client_id in range(num_clients) if online[client_id]]


@dataclass(frozen=True)
class RoundPlan:
    trained: list[int]  # clients whose updates the round applies
    dropped: list[int]  # selected clients whose updates arrive too late
    finish_times: dict[int, float]  # virtual finish time of every selected client (round start = 0)
    round_duration: float  # virtual seconds the round lasted


def plan_round(selected: list[int], durations: dict[int, float], wanted: int, stragglers: StragglerConfig) -> RoundPlan:
    """Apply the straggler policy to the selected clients' virtual durations.

    wait_all: everyone; the round lasts as long as the slowest. drop: clients
    finishing after the deadline are dropped. over_select: `selected` holds the
    over-selected set; the first `wanted` to finish are kept (ties by client id),
    and a deadline, when set, still drops late ones."""
    order = sorted(selected, key=lambda client_id: (durations[client_id], client_id))
    kept = list(order)
    if stragglers.policy == "over_select":
        kept = order[:wanted]
    deadline = stragglers.deadline
    missed_deadline = False
    if deadline is not None and stragglers.policy in ("drop", "over_select"):
        on_time = [client_id for client_id in kept if durations[client_id] <= deadline]
        missed_deadline = len(on_time) < len(kept)
        kept = on_time
    dropped = sorted(set(selected) - set(kept))
    # A round that dropped late clients ends at the deadline; otherwise when its last kept update lands.
    duration = deadline if missed_deadline else max((durations[k] for k in kept), default=0.0)
    return RoundPlan(trained=sorted(kept), dropped=dropped, finish_times={k: durations[k] for k in selected}, round_duration=duration)


def selection_size(clients_per_round: int, stragglers: StragglerConfig, num_available: int) -> int:
    if stragglers.policy == "over_select":
        return min(num_available, math.ceil(clients_per_round * stragglers.over_selection))
    return min(num_available, clients_per_round)
