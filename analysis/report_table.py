"""A report table as plain data: a title, a header and rows of cells, each cell with
its value, its best / second-best / reference mark and the flags that describe it, plus
a note. The renderings (analysis/report_tables.py) turn the marks into bold, underline
and italics (a trivial reference row), the flags into a bracket after the value, and in
CSV into columns of their own."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from analysis.final_metrics import Cell

BEST, SECOND = "best", "second"
# a trivial reference row's cells (analysis/trivial_rows.py): shown in italics, never ranked
REFERENCE = "reference"


@dataclass
class Text:
    value: str
    mark: str = ""  # BEST | SECOND | REFERENCE | ""
    # warnings on this cell (analysis/row_flags.py), each a rule's name with its detail
    flags: tuple[str, ...] = ()

    @property
    def shown(self) -> str:
        """The value as the Markdown, LaTeX and terminal tables print it: the flags in brackets after it."""
        return f"{self.value} [{'; '.join(self.flags)}]" if self.flags else self.value


@dataclass
class ReportTable:
    title: str
    header: list[str]
    rows: list[list[Text]] = field(default_factory=list)
    note: str = ""


def percent(value: float, scale: float = 100.0) -> str:
    return "-" if math.isnan(value) else f"{scale * value:.2f}"


def with_std(cell: Cell, scale: float = 100.0, signed: bool = False) -> str:
    """"mean ± std" (the std left out for one seed); `signed` marks differences with + or -."""
    text = f"{scale * cell.mean:+.2f}" if signed else percent(cell.mean, scale)
    return text if math.isnan(cell.std) else f"{text} ± {percent(cell.std, scale)}"
