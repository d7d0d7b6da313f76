"""Matching the events of two recordings of the same job, op by op: per rank, per iteration (``ProfilerStep#N``),
per kind and name, the k-th occurrence in time order on one side is the k-th on the other.

Thread ids and streams differ between recordings, so they are not part of the key; the order of a name's
occurrences within a rank's iteration is the job's own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

_KEY = ["rank", "iteration", "kind", "name", "occurrence"]


@dataclass
class Matching:
    """For every event of the base recording, the matching event of the other one (-1: none)."""

    other_event: np.ndarray  # per base event (global index)
    unmatched_base: pl.DataFrame  # name, kind, events, own_ms: base events with own time and no partner
    unmatched_other: pl.DataFrame  # the same for the other recording

    @property
    def counts(self) -> dict[str, int]:
        return {"base": int(self.unmatched_base["events"].sum()) if self.unmatched_base.height else 0,
                "other": int(self.unmatched_other["events"].sum()) if self.unmatched_other.height else 0}


def match_events(base: pl.DataFrame, other: pl.DataFrame, base_own: np.ndarray, other_own: np.ndarray) -> Matching:
    """Match two annotated event frames (one row per event, in global event order, with ``iteration``)."""
    left = _keyed(base)
    right = _keyed(other)
    joined = left.join(right, on=_KEY, how="full", suffix="_other", coalesce=True)
    pairs = joined.filter(pl.col("global").is_not_null() & pl.col("global_other").is_not_null())
    other_event = np.full(base.height, -1, dtype=np.int64)
    other_event[pairs["global"].to_numpy()] = pairs["global_other"].to_numpy()
    only_base = joined.filter(pl.col("global_other").is_null()).select("global", "name", "kind")
    only_other = joined.filter(pl.col("global").is_null()).select(pl.col("global_other").alias("global"), "name",
                                                                  "kind")
    return Matching(other_event=other_event, unmatched_base=_named(only_base, base_own),
                    unmatched_other=_named(only_other, other_own))


def _keyed(frame: pl.DataFrame) -> pl.DataFrame:
    return (
        frame.with_row_index("global")
        .with_columns(pl.col("global").cast(pl.Int64), pl.col("iteration").fill_null(-1))
        .sort("rank", "ts", "global")
        .with_columns(occurrence=pl.col("global").cum_count().over("rank", "iteration", "kind", "name"))
        .select("global", *_KEY)
    )


def _named(frame: pl.DataFrame, own: np.ndarray) -> pl.DataFrame:
    """Unmatched events that hold own time, per name: how many and how much."""
    times = own[frame["global"].to_numpy()] if frame.height else np.zeros(0)
    return (
        frame.with_columns(own_us=pl.Series(times, dtype=pl.Float64))
        .filter(pl.col("own_us") > 0)
        .group_by("name", "kind").agg(events=pl.len(), own_ms=pl.col("own_us").sum() / 1e3)
        .sort("own_ms", descending=True)
    )
