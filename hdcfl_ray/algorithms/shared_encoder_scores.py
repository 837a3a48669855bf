"""How a shared-encoder client is scored at evaluation (docs/hdcfl.md): (a) the global encoder + own head, (b) the client's own cached
encoder + own head, (c) HDC-FL's personalised mixture + own head.

FedAvg-SE's and HDC-FL's client hooks score through these functions, and so does
`ablate`'s replay of saved refreshes (ablation/replay.py): a replay with the run's
settings scores exactly as the run did because it runs the same code."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from hdcfl_ray.contract import EvalResult, EvalStats, ModelParams
from hdcfl_ray.hdcfl.prototypes import personalised_encoder


class Scorer(Protocol):
    """A client's model and test set (the contract's ClientContext fits)."""

    def score(self, params: ModelParams | None = None, head: np.ndarray | None = None) -> EvalStats: ...


def shared_encoder_scores(
    scorer: Scorer, head: np.ndarray, global_encoder: np.ndarray, own_encoder: np.ndarray | None
) -> dict[str, EvalStats]:
    """References (a) `global` and, where the server holds the client's encoder, (b) `local`."""
    references = {"global": scorer.score(ModelParams(global_encoder), head=head)}
    if own_encoder is not None:
        references["local"] = scorer.score(ModelParams(own_encoder), head=head)
    return references


def personalised_score(
    scorer: Scorer, head: np.ndarray, global_encoder: np.ndarray, prototypes: np.ndarray, membership: np.ndarray, mix: float
) -> EvalStats:
    """Reference (c): phi_k = (1 - mix) * global + mix * sum_g membership[g] * prototypes[g], with the own head.

    A hard (one-hot) membership gives every client of its group the same mixture:
    it is built once per evaluation call and its clients are scored together."""
    def build() -> np.ndarray:
        return personalised_encoder(global_encoder, prototypes, membership, mix)

    row = np.asarray(membership)
    shared_array = getattr(scorer, "shared_array", None)
    if shared_array is not None and np.count_nonzero(row) == 1:
        # the call's broadcast objects stay alive through it, so their ids name them
        mixture = shared_array(("hdcfl_mixture", id(global_encoder), id(prototypes), int(np.argmax(row)), float(mix)), build)
    else:
        mixture = build()
    return scorer.score(ModelParams(mixture), head=head)


def hdcfl_evaluation(
    scorer: Scorer,
    head: np.ndarray,
    global_encoder: np.ndarray,
    own_encoder: np.ndarray | None,
    prototypes: np.ndarray | None,
    membership: np.ndarray | None,
    group: int | None,
    mix: float,
) -> EvalResult:
    """HDC-FL's evaluation of one client. A client in the last refresh (`membership`
    given) is judged by its personalised mixture; one without a cache entry there
    falls back to the global encoder."""
    references = shared_encoder_scores(scorer, head, global_encoder, own_encoder)
    if membership is None:
        return EvalResult(references=references, headline="global")
    if prototypes is None or group is None:
        raise ValueError("a client with a membership row needs the refresh's prototypes and its group")
    references["personalized"] = personalised_score(scorer, head, global_encoder, prototypes, membership, mix)
    return EvalResult(
        references=references,
        headline="personalized",
        group=int(group),
        memberships=tuple(float(v) for v in membership),
    )
