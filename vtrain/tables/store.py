"""Reading and writing a profile folder: one Parquet file per table plus ``metadata.json``.

Profiles are written atomically: everything goes to a hidden temporary folder beside the target, which is renamed
into place only when complete, so a failed run never leaves a half-written profile behind.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from vtrain.errors import InputError
from vtrain.outputs import check_output, staged
from vtrain.tables.schema import OPTIONAL_TABLES, TABLES

METADATA_FILE = "metadata.json"


@dataclass
class Profile:
    """The tables of one profile folder and its metadata."""

    tables: dict[str, pl.DataFrame]
    metadata: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    def __getitem__(self, name: str) -> pl.DataFrame:
        return self.tables[name]

    @property
    def op_latency(self) -> pl.DataFrame:
        return self.tables["op_latency"]

    @property
    def nccl_latency(self) -> pl.DataFrame:
        return self.tables["nccl_latency"]


def empty_table(name: str) -> pl.DataFrame:
    """An empty frame with the schema of table ``name``."""
    return pl.DataFrame(schema=TABLES[name])


def conform(frame: pl.DataFrame, name: str) -> pl.DataFrame:
    """Select and cast ``frame``'s columns to the schema of table ``name`` (missing columns become null)."""
    schema = TABLES[name]
    if frame.width == 0:
        return empty_table(name)
    return frame.select([
        (pl.col(col) if col in frame.columns else pl.lit(None)).cast(dtype).alias(col)
        for col, dtype in schema.items()
    ])


def write_profile(profile: Profile, target: str | Path, *, overwrite: bool = False) -> Path:
    """Write all tables and the metadata to ``target`` atomically; returns the final path."""
    target = check_output(target, force=overwrite, what="profile folder")
    with staged(target) as staging:
        for name, frame in profile.tables.items():
            frame.write_parquet(staging / f"{name}.parquet")
        (staging / METADATA_FILE).write_text(json.dumps(profile.metadata, indent=2, sort_keys=False) + "\n")
    profile.path = target
    return target


def load_profile(path: str | Path) -> Profile:
    """Read a profile folder written by :func:`write_profile` (``vtrain ingest`` or ``vtrain calibrate``)."""
    path = Path(path)
    if not path.is_dir():
        raise InputError("no such profile folder", path)
    meta_file = path / METADATA_FILE
    if not meta_file.exists():
        raise InputError(f"not a profile folder: {METADATA_FILE} is missing", path)
    try:
        metadata = json.loads(meta_file.read_text())
    except json.JSONDecodeError as exc:
        raise InputError(f"corrupt {METADATA_FILE}: {exc.msg}", meta_file) from None
    tables: dict[str, pl.DataFrame] = {}
    for name in TABLES:
        file = path / f"{name}.parquet"
        if not file.exists() and name in OPTIONAL_TABLES:
            tables[name] = empty_table(name)
            continue
        if not file.exists():
            raise InputError(f"not a profile folder: {file.name} is missing", path)
        try:
            tables[name] = _with_new_columns(pl.read_parquet(file), name)
        except Exception as exc:  # polars raises several error types for corrupt Parquet
            raise InputError(f"corrupt table: {str(exc).splitlines()[0]}", file) from None
    return Profile(tables=tables, metadata=metadata, path=path)


def _with_new_columns(frame: pl.DataFrame, name: str) -> pl.DataFrame:
    """A table written before a column was added to its schema gets that column as nulls."""
    missing = [col for col in TABLES[name] if col not in frame.columns]
    if not missing:
        return frame
    return frame.with_columns(pl.lit(None).cast(TABLES[name][col]).alias(col) for col in missing)
