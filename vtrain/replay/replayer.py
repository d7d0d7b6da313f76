"""``replay_traces``: rebuild a trace set's dependency graph and re-simulate it with the measured durations."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from vtrain.distributed import release_freed_memory
from vtrain.replay.build import ReplayGraph, build_graph
from vtrain.replay.collective_matching import Collective
from vtrain.replay.context import DependencyStats
from vtrain.replay.engine import GroupedEdges, evaluate_grouped
from vtrain.replay.graph import ReplayOptions
from vtrain.replay.trace import RankTrace, read_trace_set
from vtrain.runconfig import RunConfig


@dataclass
class Replay:
    """A replayed trace set: every event's measured and replayed start and duration (µs since ``origin``)."""

    traces: list[RankTrace]
    #: rank, event (index in the rank's trace), kind, cat, name, lane, launch (the launching call of a device
    #: activity), external_id, input_dims, collective / purpose / matched (collective calls), ts, dur, sim_ts, sim_dur;
    #: text as categories (one copy of each distinct name: a trace has millions of events and thousands of names)
    events: pl.DataFrame
    origin: float
    stats: DependencyStats
    edge_counts: dict[str, int]
    notes: list[str] = field(default_factory=list)
    #: ranks whose step numbers ran apart from the others' -> by how many (their collectives were matched renumbered)
    step_shifts: dict[int, int] = field(default_factory=dict)


def replay_traces(trace_dir: str | Path, config: RunConfig | None = None,
                  options: ReplayOptions | None = None) -> Replay:
    """Read ``trace_dir`` and replay it."""
    return replay(read_trace_set(trace_dir), config, options)


def replay(traces: list[RankTrace], config: RunConfig | None = None,
           options: ReplayOptions | None = None) -> Replay:
    """Replay already-read rank traces."""
    return replay_graph(build_graph(traces, config, options))


def replay_graph(graph: ReplayGraph, each_rank: Callable[[pl.DataFrame], pl.DataFrame] | None = None) -> Replay:
    """Replay a built graph (:func:`vtrain.replay.build.build_graph`, or a
    :class:`~vtrain.replay.build.GraphBuilder` fed one rank at a time); its edges are released once evaluated.

    ``each_rank``, if given, is applied to each rank's event frame before the ranks' frames are put together
    (`vtrain validate` annotates them so: the working memory of the annotation is then one rank's)."""
    times, released = evaluate_grouped(graph.measured, graph.edges)
    edge_counts = graph.edges.kind_counts()
    graph.edges = GroupedEdges.empty(0, 0)  # given back: the event frame is built next
    notes: list[str] = []
    if released:
        notes.append(f"{released} of {len(times)} event points were released from dependency cycles (events with "
                     f"equal timestamps, or collectives matched in an impossible order)")
    release_freed_memory()
    return Replay(traces=graph.traces, events=_event_frame(graph, times, each_rank), origin=graph.origin,
                  stats=graph.stats, notes=notes, edge_counts=edge_counts, step_shifts=graph.step_shifts)


def read_timeline(traces: list[RankTrace]) -> pl.DataFrame:
    """The event frame of traces without replaying them (``sim_ts``/``sim_dur`` equal the measured times): for
    timelines that are predictions already, such as `vtrain simulate`'s traces."""
    graph = build_graph(traces, match_across_ranks=False)
    return _event_frame(graph, graph.measured)


def timeline(graph: ReplayGraph, times: np.ndarray) -> pl.DataFrame:
    """The event frame of ``graph`` with every point at ``times`` (as :func:`vtrain.replay.engine.evaluate`
    returns them; ``graph.measured`` gives the measured timeline): one row per event, in global event order."""
    return _event_frame(graph, times)


def _event_frame(graph: ReplayGraph, times: np.ndarray,
                 each_rank: Callable[[pl.DataFrame], pl.DataFrame] | None = None) -> pl.DataFrame:
    calls: dict[int, dict[int, Collective]] = defaultdict(dict)  # rank -> event -> its collective call
    for call in graph.calls:
        calls[call.rank][call.event] = call
    frames = []
    for trace, part, offset in zip(graph.traces, graph.parts, graph.offsets):
        n = len(part)
        start = times[2 * offset:2 * (offset + n):2]
        stop = times[2 * offset + 1:2 * (offset + n):2]
        ts = graph.measured[2 * offset:2 * (offset + n):2]
        end = graph.measured[2 * offset + 1:2 * (offset + n):2]
        mine = calls[part.rank]
        at = sorted(mine)
        columns = trace.event_columns()
        frame = pl.DataFrame({
            "rank": pl.repeat(part.rank, n, dtype=pl.Int32, eager=True),
            "event": pl.Series(np.arange(n, dtype=np.int64)),
            "kind": columns["kind"], "cat": columns["cat"], "name": columns["name"], "lane": columns["lane"],
            "launch": pl.Series(part.launch, dtype=pl.Int64).scatter(np.flatnonzero(part.launch < 0), None),
            "external_id": columns["external_id"], "input_dims": columns["input_dims"],
            "collective": _at(n, at, [mine[i].kind for i in at], pl.Categorical),
            "purpose": _at(n, at, [mine[i].purpose for i in at], pl.Categorical),
            "matched": _at(n, at, [mine[i].matched for i in at], pl.Boolean),
            "ts": pl.Series(ts, dtype=pl.Float64), "dur": pl.Series(end - ts, dtype=pl.Float64),
            "sim_ts": pl.Series(start, dtype=pl.Float64), "sim_dur": pl.Series(stop - start, dtype=pl.Float64),
        })
        frames.append(each_rank(frame) if each_rank is not None else frame)
    return pl.concat(frames, rechunk=False) if frames else pl.DataFrame()


def _at(n: int, positions: list[int], values: list, dtype: pl.DataType) -> pl.Series:
    """A column of ``n`` nulls with ``values`` at ``positions`` (the few events that are collective calls)."""
    column = pl.repeat(None, n, dtype=dtype, eager=True)
    if positions:
        column = column.scatter(positions, pl.Series(values, dtype=dtype))
    return column
