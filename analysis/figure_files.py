"""How every report figure is drawn and saved: matplotlib without a display, a file
name from a setting's name, one layout and resolution (shared by figures.py and
communication_figure.py, which it sits below)."""

from __future__ import annotations

import re
from pathlib import Path


def file_part(setting: str) -> str:
    """A setting name as a file-name part: "cpu-c10-rot (validation)" -> "cpu-c10-rot_validation"."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", setting).strip("_")


def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def save_figure(figure, path: Path) -> Path:
    """Lay out, write (PNG, 120 dpi) and close one figure; its path."""
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    pyplot().close(figure)
    return path
