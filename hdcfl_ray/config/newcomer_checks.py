"""Whether `partition.newcomers` leaves a federation to train: what the scenario check
says, naming the keys and the counts. Newcomers never train, so the counts of
`protocol.participation` and `protocol.eval_clients` apply to the other clients."""

from __future__ import annotations


def newcomer_count_problem(newcomers: int, num_clients: int, participation: float | int, eval_clients: str | float | int) -> str | None:
    """What is wrong with holding `newcomers` of `num_clients` clients out of training, or None."""
    training = num_clients - newcomers
    if training < 1:
        return (
            f"partition.newcomers: {newcomers} newcomers leave none of partition.num_clients = {num_clients} to train; "
            f"hold out at most {num_clients - 1} (or a fraction below {(num_clients - 0.5) / num_clients:.3g})"
        )
    if isinstance(participation, int) and participation > training:
        return (
            f"protocol.participation: {participation} clients per round is more than the {training} clients that train "
            f"(partition.num_clients = {num_clients} less {newcomers} newcomers)"
        )
    if isinstance(eval_clients, int) and eval_clients > training:
        return (
            f"protocol.eval_clients: {eval_clients} clients is more than the {training} clients that train "
            f"(partition.num_clients = {num_clients} less {newcomers} newcomers; newcomers are scored apart)"
        )
    return None
