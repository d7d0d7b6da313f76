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

import yaml

from vtrain.errors import InputError

_SET_KEYS = {"traces", "name", "config", "profile", "max_replay_error_pct", "max_model_error_pct"}


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
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise InputError("no such suite file", path) from None
    except OSError as exc:
        raise InputError(f"cannot read suite file: {exc.strerror}", path) from None
    except yaml.YAMLError as exc:
        raise InputError(f"suite file is not valid YAML: {str(exc).splitlines()[0]}", path) from None
    if not isinstance(data, dict) or not isinstance(data.get("sets"), list) or not data["sets"]:
        raise InputError("a suite is a mapping with a non-empty 'sets' list", path)
    base = path.parent
    entries = []
    for position, item in enumerate(data["sets"], start=1):
        entries.append(_entry(item, position, base, path))
    names = [e.name for e in entries]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate:
        raise InputError(f"two sets are named {duplicate!r}; give them distinct 'name's", path)
    return Suite(name=str(data.get("name") or path.stem), description=str(data.get("description") or ""),
                 path=path, entries=entries)


def _entry(item: Any, position: int, base: Path, path: Path) -> SuiteEntry:
    if not isinstance(item, dict) or "traces" not in item:
        raise InputError(f"set {position} must be a mapping with a 'traces' folder", path)
    unknown = set(item) - _SET_KEYS
    if unknown:
        raise InputError(f"set {position} has unknown key(s): {', '.join(sorted(unknown))}", path)
    traces = base / str(item["traces"])
    bounds = {}
    for key in ("max_replay_error_pct", "max_model_error_pct"):
        value = item.get(key)
        if value is not None and (not isinstance(value, (int, float)) or value < 0):
            raise InputError(f"set {position}: {key} must be a number >= 0 (got {value!r})", path)
        bounds[key] = None if value is None else float(value)
    return SuiteEntry(
        name=str(item.get("name") or traces.name), traces=traces,
        config=base / str(item["config"]) if item.get("config") else None,
        profile=base / str(item["profile"]) if item.get("profile") else None, **bounds)


def check(error_pct: float | None, bound: float | None) -> bool:
    """Within the bound (no bound or no prediction: nothing to check)."""
    return bound is None or error_pct is None or abs(error_pct) <= bound
