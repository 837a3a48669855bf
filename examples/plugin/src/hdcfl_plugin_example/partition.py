"""Quantity skew (NIID-Bench's "quantity-based label imbalance" counterpart): every
client draws its images uniformly from all classes, but the number of images per
client follows Dirichlet(beta) shares (Li et al., ICDE 2022)."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from hdcfl_ray.contract import Section
from hdcfl_ray.contract.data import PartitionSpec, Split


class QuantitySkewParams(Section):
    """The scenario's partition.quantity_skew section."""

    beta: float = Field(0.5, gt=0.0, description="Dirichlet concentration of the clients' shares; smaller = more skew")
    min_samples: int = Field(5, ge=1, description="images every client holds at least")


def quantity_skew(params: QuantitySkewParams, labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> Split:
    total = labels.shape[0]
    if total < params.min_samples * num_clients:
        raise ValueError(f"{total} images are too few for {num_clients} clients of at least {params.min_samples}")
    spare = total - params.min_samples * num_clients
    shares = rng.dirichlet(np.full(num_clients, params.beta))
    counts = params.min_samples + np.floor(shares * spare).astype(np.int64)
    counts[: total - counts.sum()] += 1  # the remainder, one image each
    order = rng.permutation(total)
    bounds = np.cumsum(counts)[:-1]
    return Split(client_indices=tuple(np.sort(part) for part in np.split(order, bounds)))


PARTITION = PartitionSpec(
    name="quantity_skew",
    summary="IID labels, Dirichlet(beta) client sizes (NIID-Bench quantity skew); an example plugin",
    split=quantity_skew,
    params=QuantitySkewParams,
)
