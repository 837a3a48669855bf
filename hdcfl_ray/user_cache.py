"""The user's cache folder of hdcfl-ray, one root for every cache that outlives a run
(auto-knob choices, the parsed plays): `$HDCFL_RAY_CACHE/<name>`, else
`$XDG_CACHE_HOME/hdcfl-ray/<name>`, else `~/.cache/hdcfl-ray/<name>`; never relative to
the working directory."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_VARIABLE = "HDCFL_RAY_CACHE"


def user_cache_folder(name: str) -> Path:
    """The absolute folder `name` under the user's cache root."""
    explicit = os.environ.get(CACHE_VARIABLE)
    if explicit:
        return Path(explicit).expanduser().resolve() / name
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser().resolve() / "hdcfl-ray" / name
