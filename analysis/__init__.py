"""Reading run directories and turning them into tables (usable from Python and
from `hdcfl-ray report`)."""

from analysis.runs import RunRecord, load_run, load_runs
from analysis.final_metrics import FinalMetricsRow, final_metrics_table

__all__ = ["RunRecord", "load_run", "load_runs", "FinalMetricsRow", "final_metrics_table"]
