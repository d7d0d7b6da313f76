"""Which steps of a trace set are iterations, whether its ranks were timed on one clock, and numbered their steps
alike: the ranks of one job meet in their collectives every iteration, so their steps start within an iteration of
each other on one clock. Decided by `vtrain ingest`, `validate` and `whatif` alike.

A step that holds nothing but its own ``ProfilerStep#N`` span(s) is no iteration (:func:`empty_steps`): the profiler
began it as it stopped (a schedule's cycle that the training loop ended as it began is a file of one such step per
rank, 31-38 µs long: tests/data/profiler-cycles), so it has nothing to measure, and its start, which no collective
ties to the other ranks', says nothing of their clocks. Its events are numbered none (:func:`without_steps`)
before anything reads the iterations."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import polars as pl

from vtrain.naming import ITERATION_PREFIX, iteration_numbers

#: below this, an offset between ranks' iteration starts is never a clock's (µs)
_CLOCK_SLACK_US = 1_000.0


def empty_steps(*frames: pl.DataFrame) -> pl.DataFrame:
    """The steps of ``frames`` (events with ``rank``, ``iteration``, ``name`` and ``dur``: ingest's cpu_ops and
    kernels of a rank, or a timeline of every rank's events) that are no iteration, as none of their events is
    anything but a ``ProfilerStep#N`` span (a GPU annotation of the step included): one row per rank and
    iteration, with ``dur``, the longest of its spans (µs)."""
    numbered = [frame.lazy().filter(pl.col("iteration").is_not_null()) for frame in frames]
    key = [pl.col("rank").cast(pl.Int64), pl.col("iteration").cast(pl.Int64)]
    events = pl.concat([frame.select(key) for frame in numbered]).group_by("rank", "iteration").agg(events=pl.len())
    spans = pl.concat([_step_spans(frame, key) for frame in numbered])
    steps = spans.group_by("rank", "iteration").agg(spans=pl.len(), dur=pl.col("dur").max())
    return (steps.lazy().join(events, on=["rank", "iteration"]).filter(pl.col("events") == pl.col("spans"))
            .select("rank", "iteration", "dur").sort("rank", "iteration").collect())


def _step_spans(frame: pl.LazyFrame, key: list[pl.Expr]) -> pl.DataFrame:
    """The ``ProfilerStep#N`` spans among ``frame``'s events (its ``name`` text or categories): ``key`` and
    ``dur``. The few named so are read as text, and numbered (a user's ``ProfilerStep#warmup`` is none)."""
    name = pl.col("name")
    categorical = frame.collect_schema()["name"] == pl.Categorical
    prefixed = name.cat.starts_with(ITERATION_PREFIX) if categorical else name.str.starts_with(ITERATION_PREFIX)
    spans = frame.filter(prefixed).select(*key, pl.col("dur").cast(pl.Float64), name.cast(pl.String)).collect()
    return spans.filter(iteration_numbers(pl.col("name")).is_not_null()).drop("name")


def without_steps(frame: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """``frame`` (events with ``rank`` and ``iteration``) with the events of ``steps`` (``rank``, ``iteration``;
    :func:`empty_steps`) in no iteration."""
    if steps.is_empty():
        return frame
    schema = frame.schema
    key = pl.struct(pl.col("rank").cast(schema["rank"]), pl.col("iteration").cast(schema["iteration"]))
    gone = steps.select(key).to_series().implode()
    return frame.with_columns(iteration=pl.when(pl.struct("rank", "iteration").is_in(gone)).then(None)
                              .otherwise(pl.col("iteration")))


def iteration_starts(cpu_ops: pl.LazyFrame) -> pl.DataFrame:
    """One row per rank and iteration (``rank``, ``iteration``, ``start``, ``time_us``) from the ``ProfilerStep#N``
    spans of ingest's ``cpu_ops`` that lie in an iteration (not those of a step that is none:
    :func:`empty_steps`)."""
    steps = cpu_ops.filter(pl.col("name").str.starts_with(ITERATION_PREFIX) & pl.col("iteration").is_not_null())
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
