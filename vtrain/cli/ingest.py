"""`vtrain ingest TRACE_DIR -o PROFILE_DIR`."""

from __future__ import annotations

import atexit
import gc
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from vtrain.cli.errors import user_errors
from vtrain.ingest.discover import find_trace_files
from vtrain.ingest.pipeline import ingest_traces, rank_summary
from vtrain.tables.store import Profile, write_profile

#: inputs larger than this get a progress bar on stderr (when it is a terminal)
PROGRESS_BYTES = 64 << 20


@user_errors
def ingest_command(
    trace_dir: Path = typer.Argument(..., help="Folder with one Kineto trace per rank (*.json, *.json.gz)."),
    output: Path = typer.Option(..., "-o", "--output", help="Profile folder to write."),
    force: bool = typer.Option(False, "--force", help="Replace the profile folder if it exists."),
    as_json: bool = typer.Option(False, "--json", help="Print a machine-readable summary."),
) -> None:
    """Turn real Kineto traces into kernel, CPU-op, collective and latency tables (Parquet)."""
    # the process ends after the command: freezing the heap at exit spares the collector's walk over every object
    # at shutdown (a tenth of a second with polars loaded)
    atexit.register(gc.freeze)
    files = find_trace_files(trace_dir)
    total = sum(f.stat().st_size for f in files)

    def warn(line: str) -> None:
        print(f"warning: {line}", file=sys.stderr)

    # a bar only where someone sees it: elsewhere rich draws nothing but a blank line, after importing itself
    watched = total >= PROGRESS_BYTES and sys.stderr.isatty()
    profile = _ingest_with_progress(trace_dir, total, warn) if watched else ingest_traces(trace_dir, warn=warn)
    if output.exists() and not force:
        write_profile(profile, output)  # raises the one-line "already exists" error
    write_profile(profile, output, overwrite=force)
    summary = {
        "profile": str(output),
        "world_size": profile.metadata["world_size"],
        "ranks_missing": profile.metadata["ranks_missing"],
        "device": profile.metadata["device"]["name"] or profile.metadata["device"]["type"],
        "ranks": rank_summary(profile),
        "tables": {name: frame.height for name, frame in profile.tables.items()},
    }
    if as_json:
        sys.stdout.write(json.dumps(summary) + "\n")
        return
    _print_summary(output, summary)


# rich is imported where it is used: importing it costs a small ingest a noticeable part of its run time


def _ingest_with_progress(trace_dir: Path, total: int, warn: Callable[[str], None]) -> Profile:
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("ingest"), BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("read", total=total)
        return ingest_traces(trace_dir, warn=warn, progress=lambda n: bar.advance(task, n))


def _print_summary(output: Path, summary: dict[str, Any]) -> None:
    from rich.console import Console

    console = Console()
    console.print(f"[bold]{output}[/]: {len(summary['ranks'])} rank(s) of world size "
                  f"{summary['world_size'] or '?'} on {summary['device']}")
    for name, rows in summary["tables"].items():
        console.print(f"  {name:<13} {rows:>9,} rows")
    for rank, row in summary["ranks"].items():
        console.print(f"  rank {rank}: {row['kernels']:,} device activities, compute {row['computation_us'] / 1e3:.1f} ms,"
                      f" comm {row['communication_us'] / 1e3:.1f} ms, memory {row['memory_us'] / 1e3:.1f} ms,"
                      f" {row['iterations']} iterations")
