"""A round's events as the terminal shows them: the same note for many clients on one line.

The events table keeps one row per client (docs/logs.md); on the terminal, a round in
which every client's update was rejected would otherwise print twenty identical lines.
"""

from __future__ import annotations

import re
from typing import Sequence

from hdcfl_ray.id_ranges import id_ranges, ranges_text

_PER_CLIENT = re.compile(r"^client (\d+): (.+)$", re.DOTALL)
# fewer clients than this with the same note keep a line each
GROUP_FROM = 3


def condensed_events(events: Sequence[str]) -> list[str]:
    """`events` with the per-client notes ("client N: note") that at least GROUP_FROM clients
    share folded into one line ("clients 0-19 (20): note") where the first of them stood;
    every other event as it was, in order."""
    parsed = [(event, _PER_CLIENT.match(event)) for event in events]
    clients_by_note: dict[str, list[int]] = {}
    for _, match in parsed:
        if match:
            clients_by_note.setdefault(match.group(2), []).append(int(match.group(1)))
    lines: list[str] = []
    shown: set[str] = set()
    for event, match in parsed:
        if match is None or len(clients_by_note[match.group(2)]) < GROUP_FROM:
            lines.append(event)
            continue
        note = match.group(2)
        if note not in shown:
            shown.add(note)
            clients = clients_by_note[note]
            lines.append(f"clients {ranges_text(id_ranges(clients))} ({len(set(clients))}): {note}")
    return lines
