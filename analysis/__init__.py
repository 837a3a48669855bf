"""Reading run directories and turning them into the paper's tables (usable from
Python and from `hdcfl-ray report`)."""

from analysis.final_metrics import RunMetrics, average_rank, cells, macro_average, run_metrics, tail_rank
from analysis.report_tables import all_tables, to_csv, to_latex, to_markdown
from analysis.runs import RunRecord, load_run, load_runs

__all__ = [
    "RunMetrics",
    "RunRecord",
    "all_tables",
    "average_rank",
    "cells",
    "load_run",
    "load_runs",
    "macro_average",
    "run_metrics",
    "tail_rank",
    "to_csv",
    "to_latex",
    "to_markdown",
]
