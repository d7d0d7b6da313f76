"""Reading a trace folder's ranks for `vtrain validate`, one process per rank if asked.

Each rank file is read once (:func:`vtrain.replay.trace.read_rank_trace`) and reduced to what the validation keeps
of it: its part of the replay graph (:func:`vtrain.replay.build.rank_part`, which needs only that rank's events),
its compact event columns and kept text (:class:`~vtrain.replay.trace.KeptRank`), and, when the model side builds
its profile from these traces, ingest's tables of the rank (:class:`~vtrain.validate.profile.RankTablesSink`).
Nothing of one rank depends on another, so ranks are read by ``workers`` processes or as Ray tasks alike
(:func:`vtrain.replay.trace.read_ranks`), with the same result as one at a time: the collectives are matched
across ranks afterwards, when the graph is put together.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

from vtrain.ingest.assemble import RankTables
from vtrain.parallel import Layout
from vtrain.replay.build import GraphBuilder, RankPart, rank_part
from vtrain.replay.context import DependencyStats
from vtrain.replay.graph import ReplayOptions
from vtrain.replay.trace import KeptRank, TextAside, read_rank_trace, read_ranks
from vtrain.runconfig import RunConfig
from vtrain.validate.profile import RankTablesSink


@dataclass
class ReadRank:
    """What the validation keeps of one rank file."""

    kept: KeptRank
    part: RankPart
    stats: DependencyStats
    tables: RankTables | None  # ingest's tables of the rank, when the model's profile is built from the traces

    @property
    def rank(self) -> int:
        return self.kept.rank

    @property
    def path(self) -> Path:
        return self.kept.path

    @property
    def world_size(self) -> int | None:
        return self.kept.world_size


def read_rank(config: RunConfig | None, with_tables: bool, path: Path) -> ReadRank:
    """Read one rank file and keep what the validation needs of it (runs in a worker process or a Ray task)."""
    sink = RankTablesSink() if with_tables else None
    trace = read_rank_trace(path, sink)
    part, stats = rank_part(trace, Layout.of(config) if config is not None else None, ReplayOptions())
    return ReadRank(kept=trace.kept(), part=part, stats=stats, tables=sink.ranks[0] if sink else None)


def read_for_validation(trace_dir: Path, config: RunConfig | None, sink: RankTablesSink | None, *, workers: int = 1,
                        ray_address: str | None = None) -> tuple[GraphBuilder, list[KeptRank], TextAside]:
    """Every rank of ``trace_dir`` read (by ``workers`` processes, or as Ray tasks at ``ray_address``): the graph
    builder holding each rank's part, what is kept of each rank, sorted by rank, and the temporary file that
    holds the ranks' kept text (to be closed once the replayed traces are written); ``sink`` gets each rank's
    tables."""
    builder = GraphBuilder(config)
    kept = []
    aside = TextAside()
    for read in read_ranks(trace_dir, partial(read_rank, config, sink is not None), workers=workers,
                           ray_address=ray_address):
        builder.keep(read.part, read.stats)
        if sink is not None and read.tables is not None:
            sink.ranks.append(read.tables)
        aside.take(read.kept.source)
        kept.append(read.kept)
    return builder, kept, aside
