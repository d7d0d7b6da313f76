"""``replay_traces``: rebuild a trace set's dependency graph and re-simulate it with the measured durations."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from vtrain.replay.build import DependencyStats, ReplayGraph, build_graph
from vtrain.replay.engine import CycleError, evaluate
from vtrain.replay.graph import ReplayOptions, kind_name
from vtrain.replay.trace import RankTrace, read_trace_set
from vtrain.runconfig import RunConfig


@dataclass
class Replay:
    """A replayed trace set: every event's measured and replayed start and duration (µs since ``origin``)."""

    traces: list[RankTrace]
    events: pl.DataFrame  # rank, event, kind, cat, name, lane, ts, dur, sim_ts, sim_dur
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
    notes: list[str] = []
    try:
        times = evaluate(graph.measured, *graph.edges.arrays()[:3])
    except CycleError as exc:
        notes.append(f"matching collectives across ranks gave a dependency cycle ({exc}); every collective is "
                     f"replayed with its measured duration instead")
        graph = build_graph(traces, config, options, match_across_ranks=False)
        times = evaluate(graph.measured, *graph.edges.arrays()[:3])
    counts = Counter(graph.edges.kind)
    return Replay(traces=traces, events=_event_frame(graph, times), origin=graph.origin, stats=graph.stats,
                  edge_counts={kind_name(code): n for code, n in sorted(counts.items())}, notes=notes)


def _event_frame(graph: ReplayGraph, times: np.ndarray) -> pl.DataFrame:
    frames = []
    for trace, offset in zip(graph.traces, graph.offsets):
        n = len(trace)
        start = times[2 * offset:2 * (offset + n):2]
        stop = times[2 * offset + 1:2 * (offset + n):2]
        ts = graph.measured[2 * offset:2 * (offset + n):2]
        end = graph.measured[2 * offset + 1:2 * (offset + n):2]
        frames.append(pl.DataFrame({
            "rank": pl.Series([trace.rank] * n, dtype=pl.Int32),
            "event": pl.Series(range(n), dtype=pl.Int64),
            "kind": trace.kind, "cat": trace.cat, "name": trace.name,
            "lane": pl.Series(trace.lane, dtype=pl.Int64),
            "ts": ts, "dur": end - ts, "sim_ts": start, "sim_dur": stop - start,
        }))
    return pl.concat(frames) if frames else pl.DataFrame()
