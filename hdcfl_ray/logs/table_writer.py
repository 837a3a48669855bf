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

from hdcfl_ray.durable_files import sha256_file
from hdcfl_ray.logs.schemas import TABLE_SCHEMAS


class TableWriter:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        # "clients.parquet/part-000003.parquet" -> {"round", "rows", "sha256"} of every
        # part this run logged (or a resume verified): checkpoints keep it, so a resume
        # can tell a damaged or deleted part from a whole one
        self.parts: dict[str, dict[str, Any]] = {}

    def adopt_parts(self, last_part: int, recorded: Any) -> None:
        """On resume: the kept parts (verified against `recorded`, or, for a checkpoint
        without a record, as they are on disk) become this writer's record."""
        if isinstance(recorded, dict) and recorded:
            self.parts = {name: dict(entry) for name, entry in recorded.items() if entry.get("round", 0) <= last_part}
            return
        self.parts = {}
        for table in TABLE_SCHEMAS:
            for path in sorted(self.table_dir(table).glob("part-*.parquet")):
                index = _part_index(path)
                if index is not None and index <= last_part:
                    rows = pq.read_metadata(path).num_rows
                    self.parts[f"{path.parent.name}/{path.name}"] = {"round": index, "rows": rows, "sha256": sha256_file(path)}

    def parts_up_to(self, last_part: int) -> dict[str, dict[str, Any]]:
        return {name: dict(entry) for name, entry in self.parts.items() if entry["round"] <= last_part}

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
        digest = sha256_file(temporary_path)
        os.replace(temporary_path, final_path)
        self.parts[f"{directory.name}/{final_path.name}"] = {"round": part, "rows": len(rows), "sha256": digest}
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


def verify_parts(run_dir: Path, recorded: dict[str, dict[str, Any]] | None, last_part: int) -> list[tuple[Path, str]]:
    """The kept parts (rounds up to `last_part`) that are not as recorded: (path, what
    is wrong). Without a record (a checkpoint written before parts were recorded)
    each kept part must at least read back as Parquet with its row count."""
    problems: list[tuple[Path, str]] = []
    if recorded is not None:
        for name, entry in sorted(recorded.items()):
            if entry.get("round", 0) > last_part:
                continue
            path = run_dir / name
            if not path.is_file():
                problems.append((path, "missing"))
            elif sha256_file(path) != entry.get("sha256"):
                problems.append((path, "damaged or truncated (its SHA-256 does not match the checkpoint's record)"))
        return problems
    for table in TABLE_SCHEMAS:
        directory = run_dir / f"{table}.parquet"
        if not directory.is_dir():
            continue
        for path in sorted(directory.glob("part-*.parquet")):
            index = _part_index(path)
            if index is None or index > last_part:
                continue
            footer_error = _footer_error(path)
            if footer_error is not None:
                problems.append((path, f"unreadable ({footer_error})"))
    return problems


def unreadable_parts(roots: Iterable[Path]) -> list[tuple[Path, str]]:
    """Table parts under `roots` (run folders, sweep folders) whose Parquet footer cannot
    be read: a truncated or damaged part, named before a reader trips over it."""
    problems: list[tuple[Path, str]] = []
    for root in roots:
        for path in sorted(Path(root).rglob("part-*.parquet")):
            if not path.parent.name.endswith(".parquet") or not path.is_file():
                continue
            footer_error = _footer_error(path)
            if footer_error is not None:
                problems.append((path, footer_error))
    return problems


def _footer_error(path: Path) -> str | None:
    """Why a part's Parquet footer cannot be read, or None when it reads."""
    try:
        pq.read_metadata(path)
    except (pa.ArrowException, OSError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _part_index(path: Path) -> int | None:
    stem = path.name.split(".")[0]
    return int(stem[5:]) if stem.startswith("part-") and stem[5:].isdigit() else None


def read_table(run_dir: str | Path, table: str) -> pa.Table:
    """Read a run table; hidden temporary parts of a crashed round are skipped."""
    directory = Path(run_dir) / f"{table}.parquet"
    if not directory.exists():
        return TABLE_SCHEMAS[table].empty_table()
    return pq.read_table(directory, schema=TABLE_SCHEMAS[table])
