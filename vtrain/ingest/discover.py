"""Finding the rank files of a trace folder."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

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


def is_only_trace(path: Path) -> bool:
    """Whether ``path`` is the only trace file of its folder."""
    return find_trace_files(path.parent) == [path]


def rank_and_world_size(path: Path, distributed_info: dict[str, Any] | None) -> tuple[int, int | None]:
    """The rank (``distributedInfo.rank``, else from the file name, else 0 for the only trace file of its folder:
    a single-process job's ``host_pid.timestamp.pt.trace.json``) and the world size if the trace says it."""
    info = distributed_info or {}
    rank = info.get("rank")
    if rank is None:
        rank = rank_from_file_name(path)
    if rank is None and is_only_trace(path):
        rank = 0
    if rank is None:
        raise InputError("cannot tell the rank: no distributedInfo.rank in the trace and no rank number in the "
                         "file name (name it rank-N.json.gz)", path)
    elif not _is_count(rank):
        raise InputError(f"distributedInfo.rank is {rank!r}: a rank is an integer >= 0", path)
    world = info.get("world_size")
    if world is not None and not (_is_count(world) and world > 0):
        raise InputError(f"distributedInfo.world_size is {world!r}: a world size is an integer >= 1", path)
    if world is not None and rank >= world:
        raise InputError(f"rank {rank} is outside the world size {world}", path)
    return rank, world


def _is_count(value: Any) -> bool:
    """Whether a JSON value is an integer >= 0 (``true`` and ``"3"`` are not)."""
    return type(value) is int and value >= 0
