"""How a private run's releases split between descriptors (what the server groups clients
by) and models (what it trains), read from the manifest's `privacy.releases` (the
(noise multiplier, sample rate, steps) the accountant composed, docs/privacy.md) and the
run's refresh table.

The rule, per method (docs/privacy.md, "Clustered methods under DP"):

* HDC-FL: one model release every round (the global encoder's noised mean); at a refresh
  round the descriptor releases (on the sampled clients' head sketches: their mean, the
  seeding or a Lloyd step, the Lloyd steps; one release each) and, where the refresh grouped the sketches (a row in
  refresh.parquet), one more model release (the groups' noised sums, the prototypes).
  Descriptor releases are therefore the releases left once one per round run and one per
  refresh logged are taken off.
* Every other method that accepts privacy (IFCA: one noised sum per cluster with its count,
  the cluster choice made on the client; FedAvg, FedAvg-SE): model releases only.

Where every release has one noise multiplier and sample rate, each adds the same Rényi
divergence at every order, so the shares of the releases are the shares of the RDP budget."""

from __future__ import annotations

from dataclasses import dataclass

from analysis.runs import RunRecord

# the methods whose server releases descriptors of the clients under privacy
DESCRIPTOR_METHODS = frozenset({"hdcfl"})


@dataclass(frozen=True)
class ReleaseSplit:
    descriptor: int
    model: int
    same_mechanism: bool  # every release at one (noise multiplier, sample rate): shares are budget shares

    @property
    def total(self) -> int:
        return self.descriptor + self.model

    @property
    def descriptor_share(self) -> float:
        return self.descriptor / self.total if self.total else 0.0


def release_split(run: RunRecord) -> ReleaseSplit | None:
    """The run's releases split by the module's rule; None without a privacy record, or
    where the recorded releases do not fit it (fewer than one per round run)."""
    record = run.manifest.get("privacy")
    if not isinstance(record, dict) or not isinstance(record.get("releases"), list):
        return None
    releases = [entry for entry in record["releases"] if isinstance(entry, (list, tuple)) and len(entry) == 3]
    total = sum(int(steps) for _, _, steps in releases)
    mechanisms = {(float(multiplier), float(rate)) for multiplier, rate, _ in releases}
    if run.algorithm not in DESCRIPTOR_METHODS:
        return ReleaseSplit(0, total, len(mechanisms) <= 1)
    rounds_run = record.get("rounds_run")
    if not isinstance(rounds_run, int):
        return None
    descriptor = total - rounds_run - run.refresh.num_rows
    if descriptor < 0:
        return None
    return ReleaseSplit(descriptor, total - descriptor, len(mechanisms) <= 1)
