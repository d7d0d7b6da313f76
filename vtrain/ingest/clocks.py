"""Whether the ranks of a trace set were timed on one clock: the ranks of one job meet in their collectives every
iteration, so their steps start within an iteration of each other on one clock. Said by `vtrain ingest`,
`validate` and `whatif` alike."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from vtrain.naming import ITERATION_PREFIX, iteration_numbers

#: below this, an offset between ranks' iteration starts is never a clock's (µs)
_CLOCK_SLACK_US = 1_000.0


def iteration_starts(cpu_ops: pl.LazyFrame) -> pl.DataFrame:
    """One row per rank and iteration (``rank``, ``iteration``, ``start``, ``time_us``) from the ``ProfilerStep#N``
    spans of ingest's ``cpu_ops``."""
    steps = cpu_ops.filter(pl.col("name").str.starts_with(ITERATION_PREFIX))
    return steps.select("rank", iteration=iteration_numbers(pl.col("name")), start="ts", time_us="dur").collect()


def clocks_disagree(trace_dir: Path, measured: pl.DataFrame) -> str | None:
    """A warning line when some rank starts its iterations further from the other ranks' than one iteration lasts
    (the ranks of one job meet in their collectives every iteration, so their steps start within an iteration of
    each other on one clock): the hosts' clocks were not synchronised. Each rank's times are measured on its own
    clock, so figures per rank stand; what compares times across ranks does not."""
    if measured["rank"].n_unique() < 2:
        return None
    offsets = (measured.with_columns(offset=pl.col("start") - pl.col("start").median().over("iteration"))
               .group_by("rank").agg(pl.col("offset").median()))
    reference, reference_offset = offsets.sort(pl.col("offset").abs(), "rank").row(0)  # the most typical rank
    iteration_us = float(measured["time_us"].median())
    far = (offsets.with_columns(pl.col("offset") - reference_offset)
           .filter(pl.col("offset").abs() > max(iteration_us, _CLOCK_SLACK_US)).sort("rank"))
    if far.is_empty():
        return None
    shown = ", ".join(f"rank {rank} {offset / 1e6:+,.3f} s" for rank, offset in far.head(8).iter_rows())
    more = f" and {far.height - 8} more" if far.height > 8 else ""
    return (f"{trace_dir}: the ranks' clocks disagree: {shown}{more} from rank {reference} at the start of each "
            f"iteration, more than an iteration lasts ({iteration_us / 1e3:,.1f} ms; hosts whose clocks were not "
            f"synchronised?): each rank's times stand on its own clock, times compared across ranks do not")
