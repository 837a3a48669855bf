"""LEAF's Shakespeare preprocessing (leaf/data/shakespeare/preprocess), applied to the
plays as plays_markdown.py reads them: one user per speaking role per play, the role's
text, and the roles too small to keep.

LEAF's rules, kept here:

* the user is `PLAY_ROLE`, both parts upper-cased and every run of non-word characters
  made one `_` (LEAF's `play_and_character`), e.g. `HAMLET_FIRST_PLAYER`;
* a role with 2 printed lines or fewer is dropped (LEAF's `_get_train_test_by_character`
  skips them);
* the role's text is its lines in order, each followed by a newline, newlines then made
  spaces and runs of two or more spaces one (LEAF's `__txt_to_data`), so the text ends in
  a space;
* characters are LEAF's 80-character vocabulary (sources/text.py), any other character
  the one extra symbol the text sources share.

What the source cuts from it (windows, LEAF's sample split) is in shakespeare_plays.py."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from hdcfl_ray.data.sources.plays_markdown import ParsedPlay, parse_play
from hdcfl_ray.data.sources.text import UNKNOWN, character_ids

MIN_LINES = 3  # LEAF drops a role of 2 lines or fewer ("we need at least one train and one test line")
# bump when a rule of this module or of plays_markdown.py changes: cached texts are then read anew
RULES_VERSION = 1


@dataclass(frozen=True)
class RoleTexts:
    """Every kept role's text as vocabulary ids, one after another.

    `codes[starts[r]:starts[r + 1]]` is role r's text; roles are in the sorted order of
    their ids (`roles`), as every id column is encoded here; `role_play[r]` indexes `plays`
    (the titles, in the sorted order of their upper-cased form)."""

    codes: np.ndarray  # uint8
    starts: np.ndarray  # int64, one more than there are roles
    roles: tuple[str, ...]
    role_play: np.ndarray  # int64
    role_lines: np.ndarray  # int64: printed lines per role
    plays: tuple[str, ...]
    summary: dict[str, int]  # what the reading left out, over all plays

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.starts)


def role_id(title: str, speaker: str) -> str:
    """LEAF's user name of a role: `PLAY_ROLE`."""
    return re.sub(r"\W+", "_", f"{title}_{speaker}".upper().replace(" ", "_"))


def role_text(lines: Sequence[str]) -> str:
    """A role's lines as LEAF joins them (module docstring)."""
    return re.sub(r"  +", " ", "".join(f"{line}\n" for line in lines).replace("\n", " "))


def fallback_title(path: Path) -> str:
    """A play's title from its file name, for a file without a `# Title` line."""
    return path.stem.replace("-", " ").title()


def read_roles(files: Sequence[Path]) -> RoleTexts:
    """Parse every play and keep its roles by LEAF's rules."""
    parsed = [parse_play(path.read_text(encoding="utf-8"), fallback_title(path)) for path in files]
    return roles_of(parsed)


def roles_of(parsed: Sequence[ParsedPlay]) -> RoleTexts:
    play_ids = sorted({play.title.upper(): play.title for play in parsed}.items())
    play_index = {upper: index for index, (upper, _) in enumerate(play_ids)}
    lines_by_id: dict[str, list[str]] = {}
    play_of_id: dict[str, int] = {}
    for play in parsed:
        for speaker, lines in play.lines_by_role.items():
            identifier = role_id(play.title, speaker)  # two spellings of one name are one user, as in LEAF
            lines_by_id.setdefault(identifier, []).extend(lines)
            play_of_id[identifier] = play_index[play.title.upper()]
    kept = sorted(identifier for identifier, lines in lines_by_id.items() if len(lines) >= MIN_LINES)
    texts = [character_ids(role_text(lines_by_id[identifier])) for identifier in kept]
    lengths = np.asarray([text.shape[0] for text in texts], dtype=np.int64)
    codes = np.concatenate(texts).astype(np.uint8) if texts else np.zeros(0, dtype=np.uint8)
    summary = {
        "plays": len(play_ids),
        "roles_read": len(lines_by_id),
        "roles_under_min_lines": len(lines_by_id) - len(kept),
        "unattributed_lines": sum(play.unattributed_lines for play in parsed),
        "direction_lines": sum(play.direction_lines for play in parsed),
        "joined_names": sum(play.joined_names for play in parsed),
        "other_characters": int((codes == UNKNOWN).sum()),
    }
    return RoleTexts(
        codes=codes,
        starts=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        roles=tuple(kept),
        role_play=np.asarray([play_of_id[identifier] for identifier in kept], dtype=np.int64),
        role_lines=np.asarray([len(lines_by_id[identifier]) for identifier in kept], dtype=np.int64),
        plays=tuple(title for _, title in play_ids),
        summary=summary,
    )
