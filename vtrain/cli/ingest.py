"""`vtrain ingest TRACE_DIR -o PROFILE_DIR`.

Its arguments are parsed with argparse, not typer: typer's parameter handling imports pydantic, and with typer
itself and rich (for the summary) that cost every ingest 0.09 s of start-up, 8% of a 127 MB trace's run.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import sys
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from vtrain.cli.errors import OneLineParser, report, warn
from vtrain.cli.progress import reading
from vtrain.distributed import workers_within_cores
from vtrain.errors import InputError
from vtrain.ingest.discover import find_trace_files, not_read_warnings
from vtrain.ingest.pipeline import default_workers, ingest_to_folder
from vtrain.outputs import check_output

#: the command's one-line description (also in `vtrain --help`)
HELP = "Turn real Kineto traces into kernel, CPU-op, collective and latency tables (Parquet)."

#: inputs larger than this get a progress bar on stderr (when it is a terminal)
PROGRESS_BYTES = 64 << 20
#: the most worker processes `--workers` may ask for
MAX_WORKERS = 1024


def parser() -> OneLineParser:
    """The command line of `vtrain ingest` (usage errors exit 2, as typer's do)."""
    parsed = OneLineParser(prog="vtrain ingest", description=HELP)
    parsed.add_argument("trace_dir", type=Path, metavar="TRACE_DIR",
                        help="Folder with one Kineto trace per rank (*.json, *.json.gz).")
    parsed.add_argument("-o", "--output", type=Path, required=True, help="Profile folder to write.")
    parsed.add_argument("--force", action="store_true", help="Replace the profile folder if it exists.")
    parsed.add_argument("--json", dest="as_json", action="store_true", help="Print a machine-readable summary.")
    parsed.add_argument("--workers", type=_workers, default=None, metavar="K",
                        help="Processes reading rank files in parallel (default: one per CPU core, at most one per "
                             "file; 1 for a folder under 64 MB).")
    parsed.add_argument("--ray", action="store_true",
                        help="Read rank files as Ray tasks (pip install 'vtrain[ray]'): on the cluster at "
                             "--ray-address, else RAY_ADDRESS, else a local one. The trace folder must be at the same "
                             "path on every node.")
    parsed.add_argument("--ray-address", metavar="ADDRESS",
                        help="Ray cluster address (ray://HOST:10001, auto); implies --ray.")
    return parsed


def _workers(text: str) -> int:
    """A ``--workers`` value: a whole number from 1 to :data:`MAX_WORKERS`."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--workers must be a whole number, not {text!r}") from None
    if not 1 <= value <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"--workers must be from 1 to {MAX_WORKERS}, not {value}")
    return value


def main(argv: Sequence[str]) -> int:
    """Run `vtrain ingest` with the arguments that follow the command's name; returns the exit code."""
    args = parser().parse_args(argv)
    try:
        ingest(args.trace_dir, args.output, force=args.force, as_json=args.as_json, workers=args.workers,
               ray_address=args.ray_address or ("local" if args.ray else None))
    except InputError as exc:
        return report(exc)
    return 0


def ingest(trace_dir: Path, output: Path, *, force: bool = False, as_json: bool = False,
           workers: int | None = None, ray_address: str | None = None) -> None:
    """Ingest ``trace_dir`` into the profile folder ``output`` with ``workers`` processes (by default
    :func:`~vtrain.ingest.pipeline.default_workers`), or as Ray tasks at ``ray_address``, and print a summary on
    stdout."""
    # the process ends after the command: freezing the heap at exit spares the collector's walk over every object
    # at shutdown (a tenth of a second with polars loaded)
    atexit.register(gc.freeze)
    check_output(output, inputs=[trace_dir], force=force, what="profile folder")
    files = find_trace_files(trace_dir)
    for line in not_read_warnings(trace_dir):
        warn(line)
    total = sum(f.stat().st_size for f in files)
    workers = workers_within_cores(workers, warn) if workers else default_workers(files)

    # a bar only for an input that takes a while, and only where someone sees it (vtrain.cli.progress)
    with reading("ingest", total) if total >= PROGRESS_BYTES else nullcontext() as progress:
        ranks, rows = ingest_to_folder(trace_dir, output, warn=warn, workers=workers, ray_address=ray_address,
                                       progress=progress)
    metadata = ranks.metadata
    summary = {
        "profile": str(output),
        "world_size": metadata["world_size"],
        "ranks_missing": metadata["ranks_missing"],
        "device": metadata["device"]["name"] or metadata["device"]["type"],
        "ranks": ranks.summary(),
        "tables": rows,
    }
    if as_json:
        sys.stdout.write(json.dumps(summary) + "\n")
        return
    _print_summary(output, summary)


def _print_summary(output: Path, summary: dict[str, Any]) -> None:
    lines = [f"{output}: {len(summary['ranks'])} rank(s) of world size {summary['world_size'] or '?'} on "
             f"{summary['device']}"]
    lines += [f"  {name:<13} {rows:>9,} rows" for name, rows in summary["tables"].items()]
    lines += [f"  rank {rank}: {_activities(row)}, {row['iterations']} iterations"
              for rank, row in summary["ranks"].items()]
    print("\n".join(lines))


def _activities(row: dict[str, Any]) -> str:
    """A rank's device activities and their time by class; a rank without any (a CPU run) its CPU operators."""
    if not row["kernels"]:
        return f"{row['cpu_ops']:,} CPU operators, no device activities"
    return (f"{row['kernels']:,} device activities, compute {row['computation_us'] / 1e3:.1f} ms, comm "
            f"{row['communication_us'] / 1e3:.1f} ms, memory {row['memory_us'] / 1e3:.1f} ms")
