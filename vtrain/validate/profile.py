"""The model side's latency tables, built from the events the replay decodes: `vtrain validate` reads each
trace file once (:func:`vtrain.replay.trace.read_trace_set` hands every decoded batch to a
:class:`RankTablesSink`), and ingest's own table building (:func:`vtrain.ingest.extract.event_frames`,
:func:`vtrain.ingest.assemble.assemble_rank`) turns them into the kernels, cpu_ops and collectives of each rank,
rank by rank, so that only the tables are kept.

The events are those of the tolerant decoder (:mod:`vtrain.ingest.decode`): an argument of the wrong type is
left out rather than failing the file (`vtrain ingest` itself stays strict and names the event).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import polars as pl

from vtrain.ingest.assemble import RankTables, assemble_rank
from vtrain.ingest.clocks import renumber_steps
from vtrain.ingest.decode import LooseEvent, TraceEvent, typed_event
from vtrain.ingest.extract import EventsPart, JsonText, concat_rank_events, event_frames
from vtrain.replay.trace import RankTrace
from vtrain.tables.store import Profile


class RankTablesSink:
    """Receives a rank's decoded events batch by batch (:data:`vtrain.replay.trace.Sink`) and keeps ingest's
    tables of each rank once its file is read."""

    def __init__(self) -> None:
        self.json_text = JsonText()
        self.parts: list[EventsPart] = []
        self.ranks: list[RankTables] = []

    def add(self, events: list[LooseEvent | None], times: list[float | None],
            durations: list[float | None]) -> None:
        """A batch of one rank's events, with their start times and durations read as numbers."""
        complete: list[TraceEvent] = []
        starts: list[float | None] = []
        for event, ts, dur in zip(events, times, durations):
            if event is None or event.ph != "X":
                continue
            typed = typed_event(event, ts, dur)
            if typed is not None:
                complete.append(typed)
                starts.append(ts)
        self.parts.append(event_frames(complete, starts, self.json_text))

    def restart(self) -> None:
        """The rank's file is being read again from its start: forget its batches so far."""
        self.parts = []

    def close(self, trace: RankTrace) -> None:
        """The rank's file is read: assemble its tables and drop the parts."""
        events = concat_rank_events(self.parts)
        self.parts = []
        self.ranks.append(assemble_rank(trace.rank, events, {"pg_config": trace.process_groups}))

    def profile(self, trace_dir: Path, world_size: int | None, shifts: Mapping[int, int] | None = None) -> Profile:
        """The tables of every rank read, as a profile (its latency tables are built by
        :func:`vtrain.validate.model.held_out_profile` from the iterations it keeps), the steps of the ranks in
        ``shifts`` renumbered (:func:`vtrain.ingest.clocks.step_shifts`)."""
        shifts = shifts or {}
        ranks = sorted(self.ranks, key=lambda r: r.rank)
        iterations = sorted({i - shifts.get(r.rank, 0) for r in ranks for i in r.iterations})
        return Profile(tables={name: renumber_steps(pl.concat([getattr(r, name) for r in ranks]), shifts)
                               for name in ("kernels", "cpu_ops", "collectives", "graph_launches")},
                       metadata={"kind": "profile", "source_dir": str(trace_dir), "world_size": world_size,
                                 "ranks": [r.rank for r in ranks], "iterations": iterations})
