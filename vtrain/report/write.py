"""Writing a report folder atomically: everything goes to a hidden staging folder beside the target, which
replaces the target only once complete."""

from __future__ import annotations

import json
import math
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from vtrain.outputs import REPORT, staged, write_text
from vtrain.report.validation import render_html, render_markdown
from vtrain.validate.traces import Validation


def staged_folder(target: Path, command: str) -> AbstractContextManager[Path]:
    """An empty staging folder for ``command``'s report ``target`` (which the command checked first:
    ``check_output`` with ``replaces=REPORT``): on success it replaces ``target``, on any error or interrupt it is
    removed, with the parent folders it created (``reports/``)."""
    return staged(target, REPORT, command)


def write_report_files(v: Validation, folder: Path) -> None:
    """``report.md``, ``report.html``, ``metrics.json`` and, under ``tables/``, every aligned operator and span
    and every iteration as Parquet."""
    write_text(folder / "report.md", render_markdown(v))
    write_text(folder / "report.html", render_html(v))
    write_json(folder / "metrics.json", v.to_dict())
    tables = folder / "tables"
    tables.mkdir(exist_ok=True)
    if v.iteration_table is not None:
        v.iteration_table.write_parquet(tables / "iterations.parquet")
    for comparison in (v.replay, v.model):
        if comparison is None:
            continue
        for kind, frame in (("ops", comparison.ops_table), ("spans", comparison.spans_table)):
            if frame is not None:
                frame.write_parquet(tables / f"{comparison.name}_{kind}.parquet")


def write_json(path: Path, data: dict[str, Any]) -> None:
    """JSON with NaN and infinities written as null (they are not JSON)."""
    path.write_text(json.dumps(_finite(data), indent=2) + "\n")


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


