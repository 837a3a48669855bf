"""Crash-safe Parquet tables: each table is a dataset directory `<name>.parquet/`
with one part file per round.

A Parquet file whose writer is killed has no footer and cannot be read, so a
single growing file would lose the whole run; a part is written to a hidden
temporary name and renamed into place, so a reader sees whole parts only and a
crash loses at most the round in flight. `pyarrow.parquet.read_table(dir)`,
pandas and polars read the directory as one table."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from hdcfl_ray.logs.schemas import TABLE_SCHEMAS


class TableWriter:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def table_dir(self, table: str) -> Path:
        return self.run_dir / f"{table}.parquet"

    def write_part(self, table: str, part: int, rows: Iterable[dict[str, Any]]) -> Path | None:
        rows = list(rows)
        if not rows:
            return None
        schema = TABLE_SCHEMAS[table]
        columns = {field.name: [row.get(field.name) for row in rows] for field in schema}
        arrow_table = pa.table(columns, schema=schema)
        directory = self.table_dir(table)
        directory.mkdir(parents=True, exist_ok=True)
        final_path = directory / f"part-{part:06d}.parquet"
        temporary_path = directory / f".part-{part:06d}.parquet.tmp"
        pq.write_table(arrow_table, temporary_path)
        os.replace(temporary_path, final_path)
        return final_path


def drop_parts_after(run_dir: Path, last_part: int) -> int:
    """Remove parts written after `last_part` (and unfinished temporary parts), so a
    resumed run appends without duplicating rows. Returns how many were removed."""
    removed = 0
    for table in TABLE_SCHEMAS:
        directory = run_dir / f"{table}.parquet"
        if not directory.is_dir():
            continue
        for path in directory.iterdir():
            stem = path.name.lstrip(".").split(".")[0]
            temporary = path.name.startswith(".")
            index = int(stem.removeprefix("part-")) if stem.startswith("part-") and stem[5:].isdigit() else None
            if temporary or (index is not None and index > last_part):
                path.unlink()
                removed += 1
    return removed


def read_table(run_dir: str | Path, table: str) -> pa.Table:
    """Read a run table; hidden temporary parts of a crashed round are skipped."""
    directory = Path(run_dir) / f"{table}.parquet"
    if not directory.exists():
        return TABLE_SCHEMAS[table].empty_table()
    return pq.read_table(directory, schema=TABLE_SCHEMAS[table])
