"""The innermost CPU op enclosing a point in time on a thread, for many points at once.

Ops and points are sorted together by thread, start and end (longest first). Walking that order with a stack of
open ops, the op on top of the stack at a point is the last op before the point in the order whose end is after
the point's time (one that ended earlier was popped, everything pushed after it is popped too). Finding "the last
position before ``p`` with a value above ``t``" for every point at once takes a sparse table of running maxima of
the ends and a logarithmic number of vectorised steps, so no Python code runs per op. The sort is the one of the
stack walk this replaced, stable, so ops with the same start and end nest in file order as they did there (the
later one, a child written after its parent, is the innermost) and the result is the same on every run.
"""

from __future__ import annotations

import polars as pl


def enclosing_op_ids(ops: pl.DataFrame, probes: pl.DataFrame) -> pl.DataFrame:
    """For each probe (correlation, tid, ts): the External id of the innermost op on that thread enclosing ts.

    ``ops`` has tid, ts, dur and external_id. Returns one row per probe (correlation, enclosing_id), with
    ``enclosing_id`` null where no op encloses the probe.
    """
    walk = pl.concat([
        ops.select("tid", "ts", end=pl.col("ts") + pl.col("dur"), ident="external_id", is_op=pl.lit(True)),
        probes.select("tid", "ts", end=pl.col("ts"), ident="correlation", is_op=pl.lit(False)),
    ]).sort("tid", "ts", "end", descending=[False, False, True], maintain_order=True)
    # a probe's own end is its time: it never counts as open at a later probe
    ends = walk["end"]
    points = walk.with_row_index("position").filter(~pl.col("is_op"))
    at = points["ts"]
    position = points["position"].cast(pl.Int64) - 1
    for level, window_max in reversed(list(enumerate(_running_maxima(ends)))):
        # nothing in the 2**level positions ending here is open at the point's time: look below them
        closed = (position >= 0) & (window_max.gather(position.clip(lower_bound=0)) <= at)
        position = (position - (1 << level)).zip_with(closed, position)
    safe = position.clip(lower_bound=0)
    on_thread = (position >= 0) & walk["tid"].gather(safe).eq_missing(points["tid"])
    return pl.DataFrame({
        "correlation": points["ident"],
        "enclosing_id": pl.select(pl.when(on_thread).then(walk["ident"].gather(safe))).to_series(),
    }, schema={"correlation": pl.Int64, "enclosing_id": pl.Int64})


def _running_maxima(values: pl.Series) -> list[pl.Series]:
    """Level ``k`` holds, at position ``i``, the maximum of ``values[i - 2**k + 1 : i + 1]`` (clipped at 0)."""
    levels = [values]
    width = 1
    while width * 2 <= len(values):
        previous = levels[-1]
        levels.append(pl.select(pl.max_horizontal(previous, previous.shift(width))).to_series())
        width *= 2
    return levels
