"""Plain text for a person or a file: what the terminal, the manifest and the trackers
get of an error message or of a user's value, with every terminal control sequence
taken out and every printable character around it kept.

Ray sends a worker's traceback with colour codes; a user's data or a plugin's error
can carry anything (a clear-screen, a cursor move, a title change, a carriage return
that hides what came before it on the line). On a terminal these act instead of
showing; in a stored record they stay as noise a later reader's terminal acts on.
"""

from __future__ import annotations

import re

# A control string (OSC: ESC ] or 0x9D; DCS: ESC P or 0x90; SOS: ESC X or 0x98; PM:
# ESC ^ or 0x9E; APC: ESC _ or 0x9F) whose body is printable text ended by BEL or by
# ST (ESC \ or 0x9C). A body that meets any other control, or the end of the text, is
# no control string: only its introducer is taken out (below), so an unterminated
# one never swallows the text after it.
_CONTROL_STRING = r"(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x00-\x1f\x7f-\x9f]*(?:\x07|\x1b\\|\x9c)"
# CSI (ESC [ or its 8-bit form 0x9B): parameter bytes, intermediate bytes, one final byte
_CSI = r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
# any other escape: ESC, intermediate bytes, one final byte (ESC c resets the terminal
# and clears its screen, ESC ( B picks a character set, ESC 7 saves the cursor)
_ESCAPE = r"\x1b[ -/]*[0-~]"
# every C0 and C1 control left, a lone ESC included; newline and tab are text
_CONTROL = r"[\x00-\x08\x0b-\x1f\x7f-\x9f]"

_TERMINAL_CONTROLS = re.compile("|".join((_CONTROL_STRING, _CSI, _ESCAPE, _CONTROL)))


def plain_text(text: str) -> str:
    """`text` without terminal control sequences (CSI, OSC and the other control
    strings, escapes) and without control characters other than newline and tab
    (carriage returns, backspaces, bells, C1 controls such as 0x9B); every other
    character kept, in order."""
    return _TERMINAL_CONTROLS.sub("", text)
