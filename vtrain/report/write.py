"""Writing a report folder atomically: everything goes to a hidden staging folder beside the target, which
replaces the target only once complete."""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from vtrain.outputs import check_output, mark
from vtrain.report.validation import render_html, render_markdown
from vtrain.validate.run import Validation


@contextmanager
def staged_folder(target: Path) -> Iterator[Path]:
    """Yield an empty staging folder; on success it replaces ``target`` (only a folder vtrain wrote), on any
    error it is removed."""
    check_output(target, force=True, what="report folder")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # mkdtemp makes it private; a report folder is an ordinary folder
    try:
        mark(staging)
        yield staging
        if target.exists():
            old = target.with_name(f".{target.name}.old-{staging.name[-8:]}")
            target.rename(old)
            staging.rename(target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def write_report_files(v: Validation, folder: Path) -> None:
    """``report.md``, ``report.html``, ``metrics.json`` and, under ``tables/``, every aligned operator and span
    and every iteration as Parquet."""
    (folder / "report.md").write_text(render_markdown(v))
    (folder / "report.html").write_text(render_html(v))
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


