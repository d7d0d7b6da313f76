"""Validation suites: a YAML list of trace sets with the largest iteration-time errors each may show.

::

    name: traces
    description: every trace set shipped in traces/
    sets:
      - traces: ../traces/t2p1d1        # relative to the suite file
        max_replay_error_pct: 2
        max_model_error_pct: 5          # optional; omitted: reported, not checked
        config: ...                     # optional: --config for this set
        profile: ...                    # optional: --profile for this set
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vtrain.configfile import read_config_file
from vtrain.errors import InputError
from vtrain.limits import MAX_SUITE_SETS, string_problem

_SUITE_KEYS = {"name", "description", "sets"}
_SET_KEYS = {"traces", "name", "config", "profile", "max_replay_error_pct", "max_model_error_pct"}


#: the largest error bound a set may state, in percent (NaN or 1e300 would check nothing)
MAX_ERROR_BOUND_PCT = 1000.0


@dataclass(frozen=True)
class SuiteEntry:
    """One trace set of a suite and its bounds."""

    name: str
    traces: Path
    config: Path | None
    profile: Path | None
    max_replay_error_pct: float | None
    max_model_error_pct: float | None


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    path: Path
    entries: list[SuiteEntry]


def load_suite(path: str | Path) -> Suite:
    """Read and check a suite file; paths in it are relative to its folder."""
    path = Path(path)
    data = read_config_file(path, "suite file")
    if not isinstance(data, dict) or not isinstance(data.get("sets"), list) or not data["sets"]:
        raise InputError("a suite is a mapping with a non-empty 'sets' list", path)
    if len(data["sets"]) > MAX_SUITE_SETS:
        raise InputError(f"{len(data['sets']):,} sets; a suite holds at most {MAX_SUITE_SETS:,}", path)
    unknown = set(map(str, data)) - _SUITE_KEYS
    if unknown:
        raise InputError(f"unknown key(s): {', '.join(sorted(unknown))}", path)
    for key in ("name", "description"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise InputError(string_problem(key, data[key]), path)
    if "/" in str(data.get("name") or "") or "\0" in str(data.get("name") or ""):
        raise InputError(f"name {data['name']!r} must not be a path (it names the report folder)", path)
    base = path.parent
    entries = []
    for position, item in enumerate(data["sets"], start=1):
        entries.append(_entry(item, position, base, path))
    seen: set[str] = set()
    for entry in entries:
        if entry.name in seen:
            raise InputError(f"two sets are named {entry.name!r}; give them distinct 'name's", path)
        seen.add(entry.name)
    return Suite(name=str(data.get("name") or path.stem), description=str(data.get("description") or ""),
                 path=path, entries=entries)


def _entry(item: Any, position: int, base: Path, path: Path) -> SuiteEntry:
    if not isinstance(item, dict) or "traces" not in item:
        raise InputError(f"set {position} must be a mapping with a 'traces' folder", path)
    unknown = set(map(str, item)) - _SET_KEYS
    if unknown:
        raise InputError(f"set {position} has unknown key(s): {', '.join(sorted(unknown))}", path)
    for key in ("traces", "name", "config", "profile"):
        value = item.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip() or "\0" in value):
            raise InputError(f"set {position}: {key} must be a non-empty path or name (got {value!r})", path)
    traces = base / item["traces"]
    if not traces.is_dir():
        raise InputError(f"set {position}: traces {item['traces']!r} is not a folder (paths are relative to the "
                         "suite file)", path)
    bounds = {}
    for key in ("max_replay_error_pct", "max_model_error_pct"):
        value = item.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not 0 <= value <= MAX_ERROR_BOUND_PCT):
            raise InputError(f"set {position}: {key} must be a number from 0 to {MAX_ERROR_BOUND_PCT:g} "
                             f"(got {value!r})", path)
        bounds[key] = None if value is None else float(value)
    name = item.get("name") or traces.name
    given = "name" if item.get("name") else f"name (its traces folder's, {item['traces']!r})"
    if "/" in name or name in (".", ".."):
        raise InputError(f"set {position}: {given} {name!r} must not be a path (it names the set's report folder)",
                         path)
    if name in SUITE_FILES or name.startswith("."):
        raise InputError(f"set {position}: {given} {name!r} is taken by the suite's own report "
                         f"({', '.join(SUITE_FILES)}, hidden names): give the set another name", path)
    return SuiteEntry(
        name=name, traces=traces,
        config=base / item["config"] if item.get("config") else None,
        profile=base / item["profile"] if item.get("profile") else None, **bounds)


#: the files a suite's report folder holds beside its sets' folders
SUITE_REPORT, SUITE_METRICS = "suite.md", "metrics.json"
SUITE_FILES = (SUITE_REPORT, SUITE_METRICS)


def check(error_pct: float | None, bound: float | None) -> bool:
    """Within the bound (no bound or no prediction: nothing to check)."""
    return bound is None or error_pct is None or abs(error_pct) <= bound
