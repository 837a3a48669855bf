"""This machine's memory, for the checks that refuse what would not fit (the data a
source decodes, the models a run keeps): the one probe, on the ground floor."""

from __future__ import annotations

import os


def machine_memory_bytes() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):  # not a POSIX system: no memory checks
        return None
