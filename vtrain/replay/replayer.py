"""``replay_traces``: rebuild a trace set's dependency graph and re-simulate it with the measured durations."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from vtrain.replay.build import ReplayGraph, build_graph
from vtrain.replay.context import DependencyStats
from vtrain.replay.engine import evaluate
from vtrain.replay.graph import ReplayOptions, kind_name
from vtrain.replay.trace import RankTrace, read_trace_set
from vtrain.runconfig import RunConfig


@dataclass
class Replay:
    """A replayed trace set: every event's measured and replayed start and duration (µs since ``origin``)."""

    traces: list[RankTrace]
    #: rank, event (index in the rank's trace), kind, cat, name, lane, launch (the launching call of a device
    #: activity), external_id, input_dims, collective / purpose / matched (collective calls), ts, dur, sim_ts, sim_dur
    events: pl.DataFrame
    origin: float
    stats: DependencyStats
    edge_counts: dict[str, int]
    notes: list[str] = field(default_factory=list)


def replay_traces(trace_dir: str | Path, config: RunConfig | None = None,
                  options: ReplayOptions | None = None) -> Replay:
    """Read ``trace_dir`` and replay it."""
    return replay(read_trace_set(trace_dir), config, options)


def replay(traces: list[RankTrace], config: RunConfig | None = None,
           options: ReplayOptions | None = None) -> Replay:
    """Replay already-read rank traces."""
    graph = build_graph(traces, config, options)
    times, released = evaluate(graph.measured, *graph.edges.arrays()[:3])
    notes: list[str] = []
    if released:
        notes.append(f"{released} of {len(times)} event points were released from dependency cycles (events with "
                     f"equal timestamps, or collectives matched in an impossible order)")
    counts = Counter(graph.edges.kind)
    return Replay(traces=traces, events=_event_frame(graph, times), origin=graph.origin, stats=graph.stats,
                  edge_counts={kind_name(code): n for code, n in sorted(counts.items())}, notes=notes)


def read_timeline(traces: list[RankTrace]) -> pl.DataFrame:
    """The event frame of traces without replaying them (``sim_ts``/``sim_dur`` equal the measured times): for
    timelines that are predictions already, such as `vtrain simulate`'s traces."""
    graph = build_graph(traces, match_across_ranks=False)
    return _event_frame(graph, graph.measured)


def timeline(graph: ReplayGraph, times: np.ndarray) -> pl.DataFrame:
    """The event frame of ``graph`` with every point at ``times`` (as :func:`vtrain.replay.engine.evaluate`
    returns them; ``graph.measured`` gives the measured timeline): one row per event, in global event order."""
    return _event_frame(graph, times)


def _event_frame(graph: ReplayGraph, times: np.ndarray) -> pl.DataFrame:
    calls = {(c.rank, c.event): c for c in graph.calls}
    frames = []
    for trace, offset, launches in zip(graph.traces, graph.offsets, graph.launches):
        n = len(trace)
        start = times[2 * offset:2 * (offset + n):2]
        stop = times[2 * offset + 1:2 * (offset + n):2]
        ts = graph.measured[2 * offset:2 * (offset + n):2]
        end = graph.measured[2 * offset + 1:2 * (offset + n):2]
        mine = [calls.get((trace.rank, i)) for i in range(n)]
        frames.append(pl.DataFrame({
            "rank": pl.Series([trace.rank] * n, dtype=pl.Int32),
            "event": pl.Series(range(n), dtype=pl.Int64),
            "kind": pl.Series(trace.kind, dtype=pl.String), "cat": pl.Series(trace.cat, dtype=pl.String),
            "name": pl.Series(trace.name, dtype=pl.String),
            "lane": pl.Series(np.frombuffer(trace.lane, dtype=np.int64)),
            "launch": pl.Series([launches.get(i) for i in range(n)], dtype=pl.Int64),
            "external_id": pl.Series(trace.external_id, dtype=pl.Int64),
            "input_dims": pl.Series(trace.input_dims, dtype=pl.String),
            "collective": pl.Series([c.kind if c else None for c in mine], dtype=pl.String),
            "purpose": pl.Series([c.purpose if c else None for c in mine], dtype=pl.String),
            "matched": pl.Series([c.matched if c else None for c in mine], dtype=pl.Boolean),
            "ts": pl.Series(ts, dtype=pl.Float64), "dur": pl.Series(end - ts, dtype=pl.Float64),
            "sim_ts": pl.Series(start, dtype=pl.Float64), "sim_dur": pl.Series(stop - start, dtype=pl.Float64),
        }))
    return pl.concat(frames) if frames else pl.DataFrame()
