"""The plays parsed once: each role's text (play_roles.RoleTexts) kept on disk under a key
made of the content of the play files and the reading rules, so a later run reads one
file instead of parsing 38 plays.

The key is a SHA-256 of: each play file's name (relative to the plays' folder) and
SHA-256, the rules' version (play_roles.RULES_VERSION), the line floor and the
vocabulary. Editing, adding or removing a play, or changing a rule, makes a new key; the
package's path, its install date or the run's seed do not. The windows and the
train/test split are cut from the cached texts at every load (a fraction of a second),
so one entry serves every `sequence_length` and seed, and it holds the text once (about
4 MB) rather than every window (80 times that).

The folder: `$HDCFL_RAY_CACHE/shakespeare-plays`, else
`$XDG_CACHE_HOME/hdcfl-ray/shakespeare-plays`, else `~/.cache/hdcfl-ray/shakespeare-plays`
(the root the chosen auto knobs use too). Deleting it makes the next run parse again."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Sequence

import numpy as np

from hdcfl_ray.data.sources.play_roles import MIN_LINES, RULES_VERSION, RoleTexts
from hdcfl_ray.data.sources.text import VOCABULARY
from hdcfl_ray.durable_files import fsync_directory
from hdcfl_ray.user_cache import user_cache_folder

CACHE_FOLDER = "shakespeare-plays"


def cache_root() -> Path:
    """The folder of the parsed plays (module docstring), an absolute path."""
    return user_cache_folder(CACHE_FOLDER)


def cache_key(files: Sequence[tuple[str, str]]) -> str:
    """The key of the plays `files` ((name relative to their folder, sha256), sorted) under
    today's rules."""
    digest = hashlib.sha256()
    rules = {"rules": RULES_VERSION, "min_lines": MIN_LINES, "vocabulary": VOCABULARY, "files": [list(file) for file in files]}
    digest.update(json.dumps(rules, sort_keys=True).encode("utf-8"))
    return digest.hexdigest()


def cache_path(key: str) -> Path:
    return cache_root() / f"roles-{key[:32]}.npz"


def read_cached(path: Path) -> RoleTexts | None:
    """The texts kept at `path`; None when there are none or the file is unreadable (it
    is then parsed again and rewritten)."""
    try:
        with np.load(path, allow_pickle=False) as stored:
            return RoleTexts(
                codes=stored["codes"],
                starts=stored["starts"],
                roles=tuple(str(role) for role in stored["roles"]),
                role_play=stored["role_play"],
                role_lines=stored["role_lines"],
                plays=tuple(str(play) for play in stored["plays"]),
                summary={key: int(value) for key, value in json.loads(str(stored["summary"])).items()},
            )
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None


def write_cached(path: Path, texts: RoleTexts) -> str | None:
    """Keep `texts` at `path`, whole or not at all (a unique temporary file renamed over
    it, so two runs writing at once leave one complete file); a notice when it cannot."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
        try:
            with os.fdopen(descriptor, "wb") as handle:
                np.savez(
                    handle,
                    codes=texts.codes,
                    starts=texts.starts,
                    roles=np.asarray(texts.roles, dtype=str),
                    role_play=texts.role_play,
                    role_lines=texts.role_lines,
                    plays=np.asarray(texts.plays, dtype=str),
                    summary=np.asarray(json.dumps(texts.summary)),
                )
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, path)
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)
        fsync_directory(path.parent)
    except OSError as error:
        return f"dataset.name shakespeare_plays: could not keep the parsed plays in {path.parent} ({error}); every run parses them again"
    return None
