"""Finding the rank files of a trace folder."""

from __future__ import annotations

import re
from pathlib import Path

from vtrain.errors import InputError

TRACE_SUFFIXES = (".json", ".json.gz")
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


def find_trace_files(trace_dir: str | Path) -> list[Path]:
    """Every ``*.json`` / ``*.json.gz`` (including ``*.pt.trace.json[.gz]``) directly in ``trace_dir``."""
    folder = Path(trace_dir)
    if not folder.exists():
        raise InputError("no such trace folder", folder)
    if not folder.is_dir():
        raise InputError("not a folder (give the folder that holds one trace file per rank)", folder)
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES))
    if not files:
        raise InputError("no trace files (*.json, *.json.gz) in the folder", folder)
    return files


def rank_from_file_name(path: Path) -> int | None:
    """The rank written in a file name (``rank-3.json.gz``, ``trace_rank_3.pt.trace.json``), else ``None``."""
    match = _RANK_IN_NAME.search(path.name)
    return int(match.group(1)) if match else None
