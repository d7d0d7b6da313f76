"""Whether the ranks of a trace set were timed on one clock, and numbered their steps alike: the ranks of one job
meet in their collectives every iteration, so their steps start within an iteration of each other on one clock.
Said by `vtrain ingest`, `validate` and `whatif` alike."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping
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


#: the most steps a rank's ``ProfilerStep#N`` numbers are looked for ahead of or behind the other ranks'
MAX_STEP_SHIFT = 2
#: a rank's steps renumbered by a shift start at least this many times closer to the reference rank's steps of the
#: same numbers than as numbered, for the shift to be taken (and as numbered more than half an iteration away):
#: a pipeline's later stages start each step up to 15 % of an iteration after the first (the shipped t2p2d2)
CLOSER = 4.0


def step_shifts(measured: pl.DataFrame) -> dict[int, int]:
    """Each rank whose ``ProfilerStep#N`` numbers run ``k`` ahead of the other ranks' (its profiler's ``step()``
    called ``k`` more times: its step #N+k starts with their #N) -> ``k``; ranks numbered as most are left out.

    ``measured``: one row per rank and iteration (``rank``, ``iteration``, ``start``, ``time_us``). A rank is
    shifted only when, as numbered, its steps start more than half an iteration from the reference rank's (the one
    with the most steps; or share no number with them) and, renumbered, :data:`CLOSER` times closer (within half an
    iteration where they share none): ranks of one job start each step together,
    so a rank an iteration apart as numbered and together renumbered counted its steps from another start (a clock
    off by a whole iteration or two would read the same, and is told apart by nothing in a trace: the warning says
    which ranks were renumbered)."""
    steps = measured.filter(pl.col("iteration").is_not_null()).sort("rank", "iteration")
    starts = {rank: dict(zip(group["iteration"].to_list(), group["start"].to_list()))
              for (rank,), group in steps.group_by("rank", maintain_order=True)}
    if len(starts) < 2 or measured["time_us"].drop_nulls().is_empty():
        return {}
    iteration_us = float(measured["time_us"].median())
    reference = min(starts, key=lambda rank: (-len(starts[rank]), rank))
    found = {rank: _shift(starts[reference], own, iteration_us) for rank, own in starts.items()}
    counts = Counter(found.values())
    usual = max(counts, key=lambda shift: (counts[shift], shift == 0))  # ties: the reference rank's numbers
    return {rank: shift - usual for rank, shift in sorted(found.items()) if shift != usual}


def _shift(reference: Mapping[int, float], own: Mapping[int, float], iteration_us: float) -> int:
    """How many steps ``own``'s numbers run ahead of ``reference``'s (step number -> start); 0 unless a shift
    aligns them (see :func:`step_shifts`)."""
    apart = {}
    for shift in range(-MAX_STEP_SHIFT, MAX_STEP_SHIFT + 1):
        common = [n for n in reference if n + shift in own]
        if common:
            apart[shift] = statistics.median(abs(own[n + shift] - reference[n]) for n in common)
    best = min(apart, key=lambda shift: (apart[shift], abs(shift)), default=0)
    as_numbered = apart.get(0, float("inf"))
    if best == 0 or as_numbered <= iteration_us / 2 or apart[best] * CLOSER > min(as_numbered, 2 * iteration_us):
        return 0
    return best


def renumbered_steps_warning(trace_dir: Path, shifts: Mapping[int, int], files: Mapping[int, Path]) -> str | None:
    """The warning line for ranks whose steps are renumbered (:func:`step_shifts`), naming the first one's file."""
    if not shifts:
        return None
    rank, shift = next(iter(shifts.items()))
    also = f" (and {len(shifts) - 1} other rank(s))" if len(shifts) > 1 else ""
    return (f"{files.get(rank, trace_dir)}: rank {rank}'s ProfilerStep#N numbers run {abs(shift)} "
            f"{'ahead of' if shift > 0 else 'behind'} the other ranks'{also}: its #N{shift:+d} starts with their #N "
            "(its profiler counted steps from another start); its steps are renumbered to theirs, and its "
            "collectives matched with theirs as renumbered")


def renumber_steps(frame: pl.DataFrame | pl.LazyFrame, shifts: Mapping[int, int]) -> pl.DataFrame | pl.LazyFrame:
    """``frame`` (with ``rank``, ``iteration`` and a ``name`` column of a rank's events) with the steps of each
    rank in ``shifts`` renumbered: its ``iteration`` and its ``ProfilerStep#N`` names less the shift."""
    if not shifts:
        return frame
    shift = pl.col("rank").replace_strict(shifts, default=0, return_dtype=pl.Int64)
    number = iteration_numbers(pl.col("name").cast(pl.String))
    renamed = pl.when(number.is_not_null() & (shift != 0)).then(
        pl.lit(ITERATION_PREFIX) + (number - shift).cast(pl.String)).otherwise(pl.col("name").cast(pl.String))
    columns = frame.collect_schema()
    updates = [(pl.col("iteration") - shift).alias("iteration")] if "iteration" in columns else []
    if "name" in columns:
        updates.append(renamed.cast(columns["name"]).alias("name"))
    return frame.with_columns(updates)


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
