"""A Shakespeare stand-in: lines by speaking role, in the layout of Shakespeare's Hugging Face
copy (flwrlabs/shakespeare: `character_id`, `x` the 80 characters, `y` the next one).

The lines are generated: a few plays, each with words of its own over a shared stock of
common English words, and roles whose habits differ (favourite words, line length, how
often they exclaim or ask). Each role's lines are cut into 80-character windows with the
character after each, stride 1, as LEAF cuts Shakespeare. So roles of one play share
vocabulary and roles differ in habit, which is the kind of structure a grouping method
may find in the real corpus; the words are not Shakespeare's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

_COMMON = (
    "the and to of i you my a that in is not it me with be his your this but he have as thou so will what by thy all "
    "her no do shall if are our we for on now lord good sir come more o they well love then there how make let here "
    "upon like say yet must when should was or would which than at go know hath"
).split()
_PLAYS = (
    "king crown throne blood sword war england france battle field honour soldier banner march arms duke power realm "
    "traitor rebel peace".split(),
    "love sweet night moon fair heart kiss rose maid gentle youth beauty dear star eyes tender dream garden song".split(),
    "ghost grave death murder night poison revenge spirit dark tomb fear madness guilt dagger blood storm witch".split(),
    "fool jest wit merry ale purse tavern wine sport laugh knave coin feast cheer drink bawdy riddle clown".split(),
)
_NAMES = ("KING", "QUEEN", "DUKE", "LADY", "FOOL", "GHOST", "PRINCE", "NURSE", "CAPTAIN", "FRIAR", "SERVANT", "LORD")


def _role_lines(rng: np.random.Generator, play: int, characters: int) -> str:
    """About `characters` characters of one role's lines."""
    own = _PLAYS[play]
    favourites = rng.choice(own, size=4, replace=False)
    words = [*_COMMON, *own, *favourites, *favourites]
    weights = np.concatenate([np.full(len(_COMMON), 1.0), np.full(len(own), 2.5), np.full(8, 6.0)])
    weights /= weights.sum()
    line_words = rng.uniform(4.0, 11.0)
    exclaim, ask = rng.uniform(0.0, 0.5), rng.uniform(0.0, 0.4)
    lines: list[str] = []
    total = 0
    while total < characters:
        count = max(2, int(rng.poisson(line_words)))
        text = " ".join(rng.choice(words, size=count, p=weights))
        draw = rng.random()
        ending = "!" if draw < exclaim else "?" if draw < exclaim + ask else rng.choice([".", ",", ";", ":"])
        line = text[0].upper() + text[1:] + ending
        lines.append(line)
        total += len(line) + 1
    return "\n".join(lines)


def shakespeare_roles(roles: int = 32, seed: int = 0, mean_characters: int = 500) -> dict[str, str]:
    """Each role's lines, by character id (PLAY_NAME), with unequal amounts of text."""
    rng = np.random.default_rng(seed)
    found: dict[str, str] = {}
    for role in range(roles):
        play = role % len(_PLAYS)
        name = f"PLAY{play}_{_NAMES[(role // len(_PLAYS)) % len(_NAMES)]}{role // (len(_PLAYS) * len(_NAMES)) or ''}"
        length = int(np.clip(rng.lognormal(np.log(mean_characters), 0.5), 200, 4 * mean_characters))
        found[name] = _role_lines(rng, play, length)
    return found


def windows(text: str, length: int = 80) -> list[tuple[str, str]]:
    """(the `length` characters, the next one) at every start, stride 1."""
    return [(text[start : start + length], text[start + length]) for start in range(len(text) - length)]


def write_shakespeare_standin(out: Path, roles: int = 32, seed: int = 0, mean_characters: int = 500, length: int = 80) -> Path:
    """Write `out/data/train-00000-of-00001.parquet` (character_id, x, y) and return `out`."""
    ids: list[str] = []
    xs: list[str] = []
    ys: list[str] = []
    for role, text in shakespeare_roles(roles, seed, mean_characters).items():
        for x, y in windows(text, length):
            ids.append(role)
            xs.append(x)
            ys.append(y)
    table = pa.table({"character_id": pa.array(ids, pa.string()), "x": pa.array(xs, pa.string()), "y": pa.array(ys, pa.string())})
    (out / "data").mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out / "data" / "train-00000-of-00001.parquet", compression="zstd")
    return out
