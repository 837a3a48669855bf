"""The rounds.parquet columns that summarise client accuracy over clients, in one
place for everything that reads them back (the Python API's `Run.final`, the
experiment trackers). No pyarrow here: importing it stays cheap."""

from __future__ import annotations

ACCURACY_SUMMARY_COLUMNS = (
    "mean_accuracy",
    "worst_accuracy",
    "bottom20_accuracy",
    "best_accuracy",
    "gap",
    "mean_accuracy_global",
    "worst_accuracy_global",
    "bottom20_accuracy_global",
    "mean_accuracy_local",
    "mean_accuracy_own_classes",
)
