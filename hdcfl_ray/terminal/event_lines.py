"""A round's events as the terminal shows them: the same note for many clients on one line.

The events table keeps one row per client (docs/logs.md); on the terminal, a round in
which every client's update was rejected would otherwise print twenty identical lines.
"""

from __future__ import annotations

import re
from typing import Sequence

_PER_CLIENT = re.compile(r"^client (\d+): (.+)$", re.DOTALL)
# fewer clients than this with the same note keep a line each
GROUP_FROM = 3


def client_ranges(clients: Sequence[int]) -> str:
    """Sorted client ids as runs: [0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8"."""
    ordered = sorted(set(clients))
    runs: list[str] = []
    start = previous = ordered[0]
    for client in ordered[1:] + [None]:
        if client is not None and client == previous + 1:
            previous = client
            continue
        runs.append(str(start) if start == previous else f"{start}-{previous}")
        if client is not None:
            start = previous = client
    return ", ".join(runs)


def condensed_events(events: Sequence[str]) -> list[str]:
    """`events` with the per-client notes ("client N: note") that at least GROUP_FROM clients
    share folded into one line ("clients 0-19 (20): note") where the first of them stood;
    every other event as it was, in order."""
    clients_by_note: dict[str, list[int]] = {}
    for event in events:
        match = _PER_CLIENT.match(event)
        if match:
            clients_by_note.setdefault(match.group(2), []).append(int(match.group(1)))
    lines: list[str] = []
    shown: set[str] = set()
    for event in events:
        match = _PER_CLIENT.match(event)
        if match is None or len(clients_by_note[match.group(2)]) < GROUP_FROM:
            lines.append(event)
            continue
        note = match.group(2)
        if note not in shown:
            shown.add(note)
            clients = clients_by_note[note]
            lines.append(f"clients {client_ranges(clients)} ({len(set(clients))}): {note}")
    return lines
