"""Where vtrain may write: one check for every output folder, made before any work starts.

A command's output folder (a profile, a report, a recording, predicted traces) is refused when

- it is, contains or lies inside one of the command's inputs (``vtrain ingest traces/x -o traces/x --force`` would
  otherwise replace the user's traces with a profile);
- it exists and is not a folder, or the nearest existing folder above it is not writable, or a parent is a file;
- it exists and is not empty, unless ``--force`` is given, and even then only when vtrain wrote it: a folder
  holding :data:`MARKER` (written into every output folder), or, for folders written before the marker existed,
  one that holds a profile's ``metadata.json`` or a report's ``metrics.json`` and nothing that looks like a trace.

Every writer stages its folder beside the target and renames it into place (``tables/store.py``,
``report/write.py``, ``simulate/chrome_trace.py``, ``record/launcher.py``); :func:`mark` is called on the staging
folder so that a later ``--force`` may replace it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from vtrain.errors import InputError

#: a file in every folder vtrain writes; ``--force`` replaces only folders that hold it
MARKER = ".vtrain-output"

#: files by which a folder written before the marker existed is recognised as vtrain's own
_LEGACY_SIGNATURES = ("metadata.json", "metrics.json", "drift.json")
_TRACE_SUFFIXES = (".json.gz", ".pt.trace.json", ".pt.trace.json.gz")


def check_output(target: str | Path, *, inputs: Iterable[str | Path | None] = (), force: bool = False,
                 what: str = "output folder") -> Path:
    """Raise :class:`InputError` when ``target`` may not be written (see the module docstring); returns it."""
    target = Path(target)
    _check_not_an_input(target, inputs, what)
    if target.exists() or target.is_symlink():
        _check_replaceable(target, force, what)
    _check_writable_parent(target)
    return target


def mark(folder: Path) -> None:
    """Label ``folder`` (a staging folder about to be renamed into place) as written by vtrain."""
    (folder / MARKER).write_text("written by vtrain; `--force` may replace this folder\n")


def written_by_vtrain(folder: Path) -> bool:
    """Whether ``folder`` was written by vtrain (it holds the marker, or a profile's or report's signature file
    and no trace files)."""
    if (folder / MARKER).is_file():
        return True
    names = {child.name for child in folder.iterdir()}
    has_traces = any(name.endswith(_TRACE_SUFFIXES) for name in names)
    return not has_traces and any(name in names for name in _LEGACY_SIGNATURES)


def _check_not_an_input(target: Path, inputs: Iterable[str | Path | None], what: str) -> None:
    resolved = target.resolve()
    for given in inputs:
        if given is None:
            continue
        source = Path(given).resolve()
        if resolved == source:
            raise InputError(f"the {what} is the input {given}; give another -o", target)
        if resolved in source.parents:
            raise InputError(f"the {what} contains the input {given}; give another -o", target)
        if source in resolved.parents and source.is_file():
            raise InputError(f"the {what} would lie inside the input file {given}", target)


def _check_replaceable(target: Path, force: bool, what: str) -> None:
    if not target.is_dir():
        raise InputError(f"the {what} exists and is not a folder", target)
    if not any(target.iterdir()):
        return
    if not force:
        raise InputError(f"{what} already exists (use --force to replace it)", target)
    if not written_by_vtrain(target):
        raise InputError(f"{what} exists and was not written by vtrain: --force replaces only vtrain's own "
                         "output; give another -o", target)


def _check_writable_parent(target: Path) -> None:
    parent = target.absolute().parent
    while not parent.exists():
        if parent.is_symlink():
            raise InputError("a parent of the output is a broken link", parent)
        parent = parent.parent
    if not parent.is_dir():
        raise InputError("a parent of the output is a file, not a folder", parent)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError("cannot write here (permission denied)", parent)
