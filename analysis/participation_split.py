"""Final-round accuracy split by whether a client trained in that round.

Under partial participation a method whose clients are scored with a shared model
(a cluster model, a global head) hands the clients that sat the round out a model
the round's participants just moved towards their own data. A method with private
heads keeps every client's head fitted to its own classes. The split shows which
of the two a low mean comes from: a wide participant-minus-rest difference points
at the shared model's drift, a narrow one at the encoder.
"""

from __future__ import annotations

import math
from statistics import mean

from analysis.runs import RunRecord

PARTICIPANTS = "accuracy_participants"
NON_PARTICIPANTS = "accuracy_non_participants"
DIFFERENCE = "participation_difference"  # participants minus the rest, in the same run


def participation_split(run: RunRecord, round_index: int) -> dict[str, float]:
    """Mean accuracy at `round_index` of the clients that trained in it and of the
    evaluated clients that did not, and the first minus the second; NaN for a side
    with no client (full participation, or a run logged without the per-client table)."""
    split = {PARTICIPANTS: math.nan, NON_PARTICIPANTS: math.nan, DIFFERENCE: math.nan}
    columns = run.clients.column_names
    if not {"round", "participated", "accuracy"} <= set(columns):
        return split
    rounds = run.clients.column("round").to_pylist()
    participated = run.clients.column("participated").to_pylist()
    accuracy = run.clients.column("accuracy").to_pylist()
    sides: dict[bool, list[float]] = {True: [], False: []}
    for row_round, trained, score in zip(rounds, participated, accuracy):
        if row_round == round_index and score is not None and not math.isnan(score):
            sides[bool(trained)].append(float(score))
    if sides[True]:
        split[PARTICIPANTS] = mean(sides[True])
    if sides[False]:
        split[NON_PARTICIPANTS] = mean(sides[False])
    split[DIFFERENCE] = split[PARTICIPANTS] - split[NON_PARTICIPANTS]
    return split
