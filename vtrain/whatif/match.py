"""Matching the events of two recordings of the same job, op by op: per rank, per iteration (``ProfilerStep#N``),
per kind and name, the k-th occurrence in time order on one side is the k-th on the other.

Thread ids and streams differ between recordings, so they are not part of the key; the order of a name's
occurrences within a rank's iteration is the job's own. Device activities left over (another build may pick
other kernels for the same operator) are then matched by the CPU operator that launched them, the k-th
left-over launch of an operator on one side to the k-th on the other.
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
    by_name = _keyed(base, "name").join(_keyed(other, "name"), on=_KEY, how="full", suffix="_other", coalesce=True)
    pairs = [by_name.filter(pl.col("global").is_not_null() & pl.col("global_other").is_not_null())]
    left = _leftover_devices(base, by_name.filter(pl.col("global_other").is_null())["global"])
    right = _leftover_devices(other, by_name.filter(pl.col("global").is_null())["global_other"])
    by_launch = _keyed(left, "op").join(_keyed(right, "op"), on=_KEY, how="inner", suffix="_other")
    pairs.append(by_launch)
    other_event = np.full(base.height, -1, dtype=np.int64)
    for matched in pairs:
        other_event[matched["global"].to_numpy()] = matched["global_other"].to_numpy()
    only_base = base.with_row_index("global").filter(pl.Series(other_event < 0))
    matched_other = np.zeros(other.height, dtype=bool)
    matched_other[other_event[other_event >= 0]] = True
    only_other = other.with_row_index("global").filter(pl.Series(~matched_other))
    return Matching(other_event=other_event, unmatched_base=_named(only_base, base_own),
                    unmatched_other=_named(only_other, other_own))


def _leftover_devices(frame: pl.DataFrame, events: pl.Series) -> pl.DataFrame:
    """The device activities among ``events`` (global indices), with their index as ``global_``."""
    return (frame.with_row_index("global_").filter(pl.col("global_").is_in(events.cast(pl.UInt32).implode())
                                                    & (pl.col("kind") == "device")))


def _keyed(frame: pl.DataFrame, label: str) -> pl.DataFrame:
    """Events keyed by rank, iteration, kind, ``label`` (a column: the name, or the launching operator) and
    occurrence; ``global`` is the event's index (a ``global_`` column when ``frame`` is a subset)."""
    index = pl.col("global_") if "global_" in frame.columns else pl.int_range(pl.len())
    return (
        frame.with_columns(global_=index.cast(pl.Int64), iteration=pl.col("iteration").fill_null(-1),
                           name=pl.col(label))
        .sort("rank", "ts", "global_")
        .with_columns(occurrence=pl.col("global_").cum_count().over("rank", "iteration", "kind", "name"))
        .select(pl.col("global_").alias("global"), *_KEY)
    )


def _named(frame: pl.DataFrame, own: np.ndarray) -> pl.DataFrame:
    """Unmatched events that hold own time, per name: how many and how much."""
    times = own[frame["global"].cast(pl.Int64).to_numpy()] if frame.height else np.zeros(0)
    return (
        frame.with_columns(own_us=pl.Series(times, dtype=pl.Float64))
        .filter(pl.col("own_us") > 0)
        .group_by("name", "kind").agg(events=pl.len(), own_ms=pl.col("own_us").sum() / 1e3)
        .sort("own_ms", descending=True)
    )
