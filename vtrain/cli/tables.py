"""`vtrain tables PROFILE_DIR [--top N]`."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import typer
from rich.console import Console
from rich.table import Table

from vtrain.cli.errors import user_errors
from vtrain.tables.store import load_profile


def _shorten(text: str | None, width: int) -> str:
    if text is None:
        return "-"
    return text if len(text) <= width else text[: width - 1] + "…"


@user_errors
def tables_command(
    profile_dir: Path = typer.Argument(..., help="A profile folder written by `vtrain ingest`."),
    top: int = typer.Option(15, "--top", min=1, help="Rows per table."),
) -> None:
    """Print a profile's operator and NCCL latency tables, slowest first."""
    profile = load_profile(profile_dir)
    meta = profile.metadata
    console = Console()
    device = meta.get("device", {})
    console.print(f"[bold]{profile_dir}[/]: {device.get('name') or device.get('type')}, ranks {meta.get('ranks')} "
                  f"of {meta.get('world_size') or '?'}, iterations {meta.get('iterations')}")

    ops = profile.op_latency.sort(pl.col("median_us") * pl.col("count"), descending=True).head(top)
    table = Table(title=f"op_latency: top {top} of {profile.op_latency.height} signatures by total time")
    for column in ("op", "input dims", "types", "kernels", "count", "median µs", "p10 µs", "p90 µs"):
        table.add_column(column, justify="right" if "µs" in column or column == "count" else "left")
    for row in ops.iter_rows(named=True):
        table.add_row(_shorten(row["op"], 40), _shorten(row["input_dims"], 30), _shorten(row["input_types"], 20),
                      f"{row['n_kernels']}: {_shorten(row['kernels'], 40)}", f"{row['count']:,}",
                      f"{row['median_us']:.1f}", f"{row['p10_us']:.1f}", f"{row['p90_us']:.1f}")
    console.print(table)

    nccl = profile.nccl_latency.head(top)
    table = Table(title=f"nccl_latency: {min(top, nccl.height)} of {profile.nccl_latency.height} rows")
    for column in ("collective", "group", "bytes", "count", "median µs", "algbw GB/s", "busbw GB/s", "algorithm"):
        table.add_column(column, justify="left" if column in ("collective", "algorithm") else "right")
    for row in nccl.iter_rows(named=True):
        busbw = "-" if row["busbw_gbps"] is None else f"{row['busbw_gbps']:.2f}"
        table.add_row(row["collective"], str(row["group_size"] or "?"), f"{row['bytes']:,}", f"{row['count']:,}",
                      f"{row['median_us']:.1f}", f"{row['algbw_gbps']:.2f}", busbw, row["algorithm"] or "-")
    console.print(table)
