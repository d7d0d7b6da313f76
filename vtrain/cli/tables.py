"""`vtrain tables PROFILE_DIR [--top N]`.

The tables fit the terminal: operator and collective names are never abbreviated (a long one wraps), shapes and
NCCL algorithms wrap, numbers never wrap, and at narrow widths the least needed columns (dtypes, algorithm
bandwidth, kernel names) go first.
"""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import typer
from rich import box
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from vtrain.cli.errors import user_errors, warn
from vtrain.errors import number_ranges
from vtrain.limits import MAX_KEPT_WARNINGS, MAX_TABLE_ROWS
from vtrain.report.console import stdout_console
from vtrain.tables.latency import RAW_DURATION
from vtrain.tables.store import load_profile

#: most characters of one warning kept in a profile that `vtrain tables` prints (one line, not a page)
_LONGEST_WARNING = 2000
#: below this many columns the op table shows no kernel names and the NCCL table no algorithm bandwidth
WIDE = 110


@user_errors
def tables_command(
    profile_dir: Path = typer.Argument(..., help="A profile folder written by `vtrain ingest`."),
    top: int = typer.Option(15, "--top", min=1, max=MAX_TABLE_ROWS, help="Rows per table."),
) -> None:
    """Print a profile's operator and NCCL latency tables, slowest first (and, first, the warnings its ingest gave)."""
    profile = load_profile(profile_dir)
    meta = profile.metadata
    said = meta.get("warnings") or []  # ingest's, said again where the tables are read
    for line in said[:MAX_KEPT_WARNINGS + 1]:
        warn(f"(when the traces were ingested) {line[:_LONGEST_WARNING]}")
    if len(said) > MAX_KEPT_WARNINGS + 1:
        warn(f"(when the traces were ingested) ... and {len(said) - MAX_KEPT_WARNINGS - 1:,} more warning(s) in "
             f"{profile_dir / 'metadata.json'}")
    console = stdout_console()
    device = meta.get("device") or {}
    named = device.get("name") or device.get("type") or "device unknown"
    console.print(f"[bold]{escape(str(profile_dir))}[/]: {escape(named)}, {escape(whence(meta))}")
    wide = console.width >= WIDE
    console.print(op_table(profile.op_latency, top, wide))
    console.print(nccl_table(profile.nccl_latency, top, wide))


def whence(meta: dict) -> str:
    """What a profile's tables were made from: the ranks and iterations of its traces (``ranks 0-7 of 8,
    iterations 1-10``), or the files its device model was fitted to."""
    if meta.get("ranks"):
        return (f"ranks {number_ranges(meta['ranks'])} of {meta.get('world_size') or '?'}, "
                f"iterations {number_ranges(meta.get('iterations') or []) or 'none'}")
    sources = [each for each in meta.get("sources") or [] if isinstance(each, dict)]
    files = sum("file" in each for each in sources)
    traced = [each for each in sources if "profile" in each]  # `vtrain fit --profile`: a profile of traces
    ranks = sum(len(each.get("sources") or []) for each in traced)
    said = [f"{files:,} measurement file(s)"] if files else []
    said += [f"the traces of {len(traced)} profile(s) ({ranks} rank file(s))"] if traced else []
    return f"fitted to {' and '.join(said)}" if said else "no traces, no measurements named"


def op_table(op_latency: pl.DataFrame, top: int, wide: bool) -> Table:
    """The ``top`` operator signatures by total time; narrow terminals show each shape under its operator."""
    ops = op_latency.sort(pl.col("median_us") * pl.col("count"), descending=True).head(top)
    table = Table(title=f"op_latency: top {top} of {op_latency.height} signatures by total time (times in µs)",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("op" if wide else "op / input dims · dtypes", overflow="fold", ratio=2)
    if wide:
        table.add_column("input dims · dtypes", overflow="fold", ratio=2)
        table.add_column("kernels", overflow="ellipsis", ratio=1)
    for column in ("count", "median", "p10", "p90"):
        table.add_column(column, justify="right", no_wrap=True)
    for row in ops.iter_rows(named=True):
        shape = " · ".join(part for part in (row["input_dims"], row["input_types"]) if part) or "-"
        op = row["op"] or "-"
        cells = [Text(op), Text(shape)] if wide else [Text.assemble(op, "\n", (shape, "dim"))]
        if wide:
            cells.append(Text(f"{row['n_kernels']}: {kernel_names(row['kernels'])}"))
        cells += [f"{row['count']:,}", f"{row['median_us']:.1f}",
                  *("-" if row[key] is None else f"{row[key]:.1f}" for key in ("p10_us", "p90_us"))]
        table.add_row(*cells)
    return table


def nccl_table(nccl_latency: pl.DataFrame, top: int, wide: bool) -> Table:
    """The first ``top`` rows of the collective latency table. A median of raw per-rank durations (no peer's trace
    to match the call with: the rank's wait for the others is in it) is marked ``*``; where a table has collectives
    on the host (gloo) and on the GPU (NCCL) both, the host's are named so."""
    nccl = nccl_latency.head(top)
    raw = nccl.filter(pl.col("duration_source") == RAW_DURATION).height > 0
    both = nccl_latency["device_type"].n_unique() > 1
    table = Table(title=f"nccl_latency: {min(top, nccl.height)} of {nccl_latency.height} rows",
                  caption="* raw durations of one rank, its wait for the others included: no peer's trace matched "
                          "the call" if raw else None, box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("collective", overflow="fold")
    columns = ["group", "bytes", "count", "median µs", *(["algbw GB/s"] if wide else []), "busbw GB/s"]
    for column in columns:
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("algorithm", overflow="fold")
    for row in nccl.iter_rows(named=True):
        algbw, busbw = ("-" if row[key] is None else f"{row[key]:.2f}" for key in ("algbw_gbps", "busbw_gbps"))
        mark = "*" if row["duration_source"] == RAW_DURATION else ""
        name = f"{row['collective']} (host)" if both and row["device_type"] == "cpu" else row["collective"]
        cells = [name, str(row["group_size"] or "?"), size(row["bytes"]), f"{row['count']:,}",
                 f"{row['median_us']:.1f}{mark}", *([algbw] if wide else []), busbw,
                 row["algorithm"] or "-"]
        table.add_row(*cells)
    return table


def kernel_names(kernels: str | None) -> str:
    """Kernel names without return types, template arguments or parameter lists (``void at::native::f<...>(...)``
    -> ``at::native::f``)."""
    if not kernels:
        return "-"
    return ", ".join(_short_kernel(name) for name in kernels.split(";"))


def size(count: int | None) -> str:
    """Bytes in binary units (``8.2 MiB``)."""
    if count is None:
        return "-"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{value:,.1f} GiB"


def _short_kernel(name: str) -> str:
    name = re.sub(r"^(void|__global__)\s+", "", name.strip())
    return re.split(r"[<(]", name, maxsplit=1)[0] or name
