"""How a shared-encoder client is scored: references (a) global, (b) local and
(c) personalised, and which one HDC-FL's headline uses (docs/hdcfl.md, "Evaluation references")."""

from __future__ import annotations

import numpy as np

from hdcfl_ray.contract import ModelParams
from hdcfl_ray.algorithms.shared_encoder_scores import hdcfl_evaluation, shared_encoder_scores
from hdcfl_ray.hdcfl.prototypes import personalised_encoder
from hdcfl_ray.contract import EvalStats

HEAD = np.array([2.0, -1.0], np.float32)
GLOBAL = np.array([1.0, 0.0, 0.0], np.float32)
OWN = np.array([0.0, 1.0, 0.0], np.float32)
PROTOTYPES = np.array([[0.0, 0.0, 4.0], [8.0, 0.0, 0.0]], np.float32)
MEMBERSHIP = np.array([0.25, 0.75])


class RecordingScorer:
    """Scores a model by a number made of its encoder and head, and records what it scored."""

    def __init__(self) -> None:
        self.scored: list[tuple[np.ndarray, np.ndarray]] = []

    def score(self, params: ModelParams | None = None, head: np.ndarray | None = None) -> EvalStats:
        self.scored.append((params.encoder, head))
        value = float(np.dot(params.encoder, [1.0, 10.0, 100.0]) + head[0])
        return EvalStats(accuracy=value, loss=-value, num_samples=3)


def test_shared_encoder_scores_pair_the_global_and_own_encoder_with_the_own_head() -> None:
    scorer = RecordingScorer()
    references = shared_encoder_scores(scorer, HEAD, GLOBAL, OWN)
    assert list(references) == ["global", "local"]
    assert [encoder.tolist() for encoder, _ in scorer.scored] == [GLOBAL.tolist(), OWN.tolist()]
    assert all(head is HEAD for _, head in scorer.scored)
    assert list(shared_encoder_scores(RecordingScorer(), HEAD, GLOBAL, None)) == ["global"]


def test_a_client_missing_from_the_last_refresh_is_judged_by_the_global_encoder() -> None:
    result = hdcfl_evaluation(RecordingScorer(), HEAD, GLOBAL, None, prototypes=None, membership=None, group=None, mix=1.0)
    assert result.headline == "global" and list(result.references) == ["global"]
    assert result.group is None and result.memberships is None


def test_a_client_in_the_refresh_is_judged_by_its_personalised_mixture_and_own_head() -> None:
    scorer = RecordingScorer()
    result = hdcfl_evaluation(scorer, HEAD, GLOBAL, OWN, prototypes=PROTOTYPES, membership=MEMBERSHIP, group=1, mix=0.5)
    assert result.headline == "personalized" and list(result.references) == ["global", "local", "personalized"]
    mixture, head = scorer.scored[-1]
    assert np.array_equal(mixture, personalised_encoder(GLOBAL, PROTOTYPES, MEMBERSHIP, 0.5)) and head is HEAD
    assert result.group == 1 and result.memberships == (0.25, 0.75)
