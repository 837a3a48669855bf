"""The run directory: resolved scenario, manifest and crash-safe Parquet tables."""
