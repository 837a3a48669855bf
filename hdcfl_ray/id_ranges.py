"""Client ids as runs of consecutive ids: what a record or a line of text keeps of a set
of clients (a host's 100,000 clients, the twenty clients a round rejected)."""

from __future__ import annotations

from typing import Iterable, Sequence


def id_ranges(ids: Iterable[int]) -> list[list[int]]:
    """The distinct ids as [first, last] runs, in order: [5, 0, 1, 2, 7, 8] -> [[0, 2], [5, 5], [7, 8]]."""
    ranges: list[list[int]] = []
    for current in sorted(set(ids)):
        if ranges and ranges[-1][1] == current - 1:
            ranges[-1][1] = current
        else:
            ranges.append([current, current])
    return ranges


def ranges_text(ranges: Iterable[Sequence[int]]) -> str:
    """[first, last] runs as text: [[0, 2], [5, 5], [7, 8]] -> "0-2, 5, 7-8"."""
    return ", ".join(f"{first}" if first == last else f"{first}-{last}" for first, last in ranges)
