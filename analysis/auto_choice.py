"""What chose a run's `auto` knobs, as a report keeps it apart: the rule (its text, as
the manifest's `auto_knobs` record holds it) and the code that made the choice (the
record's `code`, the digest the choice's cache key held).

Runs of one method whose knobs are `auto` are one row whatever values they chose, as a
setting is (hdcfl_ray/config/fingerprint.py); but values chosen under another rule, or
by other code, are another method's values, and their runs are never averaged with
these. So where a report's runs of one row name differ in what chose their knobs, each
such run's row is named by what differs: `pacfl [auto rule 1a2b3c4d]` beside
`pacfl [auto rule 5e6f7a8b]` (a digest of the rule's text, which every table's note
spells out), or, where runs of one rule differ in code, `pacfl [auto code cfbeb3f4]`.
The split is over the whole report, not per column, so that a row is the same rule in
every column and a macro value never averages two rules either.

A record made before records kept their code has none: it was made by older code than
any record that has one, so it counts as other code (`auto code unrecorded`)."""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

from hdcfl_ray.auto_knobs.record import RECORD_KEY

# the parts of a choice that split rows, in the order a row name shows them, with their label
CHOICE_PARTS = (("rule", "auto rule"), ("code", "auto code"))
UNRECORDED = "unrecorded"
_SHORT = 8  # hex digits of a digest in a row name


def choice_of(manifest: Mapping[str, Any]) -> dict[str, str] | None:
    """{"rule": its text, "code": its digest or UNRECORDED} of the run's auto choice;
    None for a run with no auto knob."""
    record = manifest.get(RECORD_KEY)
    if not isinstance(record, Mapping):
        return None
    return {"rule": str(record.get("rule") or ""), "code": str(record.get("code") or UNRECORDED)}


def choice_tag(part: str, value: str) -> str:
    """How a row name shows one part of a choice: 'auto rule 1a2b3c4d', 'auto code unrecorded'."""
    label = dict(CHOICE_PARTS)[part]
    if part == "code":  # already digests (the package's, '+' a plugin's): their start, as a commit is shortened
        return f"{label} {value if value == UNRECORDED else '+'.join(piece[:_SHORT] for piece in value.split('+'))}"
    return f"{label} {hashlib.sha256(value.encode('utf-8')).hexdigest()[:_SHORT]}"


def choice_tags(choices: Mapping[Hashable, dict[str, str] | None]) -> dict[Hashable, list[str]]:
    """For the runs of one row name ({run: choice_of(its manifest)}): each run's tags
    ([] for runs with no auto knob, or when every choice agrees). The rule is named where
    the runs' rules differ; the code only where runs of one rule differ in it, since a
    rule changes with its code and two tags would say one thing twice."""
    known = [choice for choice in choices.values() if choice is not None]
    rules = {choice["rule"] for choice in known}
    differing = ["rule"] if len(rules) > 1 else []
    if len({(choice["rule"], choice["code"]) for choice in known}) > len(rules):
        differing.append("code")
    return {run: [choice_tag(part, choice[part]) for part in differing] if choice else [] for run, choice in choices.items()}


def chosen_by_note(rows: Iterable[tuple[str, Mapping[str, Any] | None]]) -> str:
    """For a table's note: what each tag in the row names stands for ('' when no row was
    split). `rows`: each run's row name and its `auto_knobs` record."""
    meanings: dict[str, str] = {}
    for name, record in rows:
        choice = choice_of({RECORD_KEY: record})
        for part, value in (choice or {}).items():
            tag = choice_tag(part, value)
            if f"{tag}]" in name or f"{tag}," in name:  # a whole tag of the row's brackets
                meanings[tag] = _meaning(part, value)
    if not meanings:
        return ""
    order = [label for _, label in CHOICE_PARTS]  # rules first, then codes
    listed = "; ".join(f"[{tag}] {meanings[tag]}" for tag in sorted(meanings, key=lambda tag: (order.index(tag.rsplit(' ', 1)[0]), tag)))
    return (
        "Rows split by what chose their auto knobs, never averaged together (a rule is tagged by a digest of its "
        f"text, the code by the start of its digest): {listed}."
    )


def _meaning(part: str, value: str) -> str:
    if part == "rule":
        return value or "no rule recorded"
    if value == UNRECORDED:
        return "chosen before runs recorded the code that chose"
    return f"chosen by the code of digest {value}"
