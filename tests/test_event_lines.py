"""The terminal folds a note many clients share in a round into one line (the events
table keeps a row per client)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hdcfl_ray.id_ranges import id_ranges, ranges_text
from hdcfl_ray.terminal.event_lines import GROUP_FROM, condensed_events

REJECTED = "update rejected (NaN/Inf); not aggregated"


def test_twenty_rejected_updates_are_one_line_in_place_of_the_first() -> None:
    events = ["fedce round 30: noised component weights [4.9, 5.0]"] + [f"client {k}: {REJECTED}" for k in range(20)] + ["done"]
    assert condensed_events(events) == [events[0], f"clients 0-19 (20): {REJECTED}", "done"]


def test_a_note_few_clients_share_keeps_a_line_each_and_other_notes_stay_apart() -> None:
    events = [f"client 3: {REJECTED}", "client 4: diverged", f"client 5: {REJECTED}", f"client 9: {REJECTED}", "client 7: diverged"]
    assert condensed_events(events) == [f"clients 3, 5, 9 (3): {REJECTED}", "client 4: diverged", "client 7: diverged"]
    assert GROUP_FROM == 3


def test_client_ids_are_written_as_runs() -> None:
    assert id_ranges([8, 0, 2, 1, 5, 7, 7]) == [[0, 2], [5, 5], [7, 8]]
    assert ranges_text(id_ranges([8, 0, 2, 1, 5, 7])) == "0-2, 5, 7-8"
    assert ranges_text(id_ranges([4])) == "4"


def _covered(lines: list[str]) -> set[tuple[int, str]]:
    """(client, note) pairs the shown lines stand for, ranges read back."""
    pairs = set()
    for line in lines:
        head, note = line.split(": ", 1)
        if head.startswith("clients "):
            ranges = head[len("clients ") :].rsplit(" (", 1)[0]
            for part in ranges.split(", "):
                low, _, high = part.partition("-")
                pairs |= {(client, note) for client in range(int(low), int(high or low) + 1)}
        else:
            pairs.add((int(head.split()[1]), note))
    return pairs


@given(st.lists(st.tuples(st.integers(0, 40), st.sampled_from([REJECTED, "diverged", "late"])), max_size=60))
def test_every_client_and_note_is_still_shown_and_nothing_else(pairs) -> None:
    lines = condensed_events([f"client {client}: {note}" for client, note in pairs])
    assert _covered(lines) == set(pairs)
    assert len(lines) <= len(pairs)
