"""What every part of a rank's graph building shares: the rank's events, where its points are numbered from,
the edge list being filled and the statistics being counted."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from vtrain.replay.graph import EdgeList, ReplayOptions
from vtrain.replay.trace import RUNTIME, RankTrace


@dataclass
class DependencyStats:
    """What the dependency model found: counts per explanation, and the time it could not explain."""

    device_started_by: Counter[str] = field(default_factory=Counter)  # launch, stream, event, inferred, none
    device_unexplained_us: float = 0.0
    blocked_calls: Counter[str] = field(default_factory=Counter)  # explicit, inferred, none
    thread_waits: int = 0
    collectives_matched: int = 0
    collective_calls_unmatched: Counter[str] = field(default_factory=Counter)
    collective_ends: Counter[str] = field(default_factory=Counter)  # peers, waited, measured


class RankContext:
    """One rank's events and the graph being built; ``start(i)`` / ``stop(i)`` are the global points of local
    event ``i``."""

    def __init__(self, trace: RankTrace, offset: int, options: ReplayOptions, edges: EdgeList,
                 stats: DependencyStats) -> None:
        self.trace = trace
        self.offset = offset
        self.options = options
        self.edges = edges
        self.stats = stats
        self.end = [t + d for t, d in zip(trace.ts, trace.dur)]
        self.runtime_by_correlation: dict[int, int] = {}
        for i, kind in enumerate(trace.kind):
            if kind == RUNTIME and trace.correlation[i] is not None:
                self.runtime_by_correlation.setdefault(trace.correlation[i], i)

    def start(self, i: int) -> int:
        return 2 * (self.offset + i)

    def stop(self, i: int) -> int:
        return 2 * (self.offset + i) + 1

    def runtime_call(self, correlation: int | None) -> int | None:
        """The runtime call with this correlation id."""
        return None if correlation is None else self.runtime_by_correlation.get(correlation)
